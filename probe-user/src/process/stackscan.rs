//! Which driver entry point a thread is inside, from its instruction pointer and a copy of the
//! top of its stack.
//!
//! Needed for threads that were already waiting when wedgeprobe attached — the usual case at
//! 3 a.m.: their entry uprobe never fired. libcuda has no frame pointers, so the stack is
//! *scanned* (as Breakpad's stackwalker does when CFI is missing): a word counts as a return
//! address (RA) only if it points into executable code right after a `call` instruction.
//!
//! Stacks seen on the H200 (driver 580.159.04), innermost first, L = libcuda, C = libc,
//! A = anything else (the application, cudart), E = inside a traced entry point:
//!   launch blocked on the full queue:  L C L C L C L  L·E(cuLaunchKernel)  A C A …
//!   cudaStreamSynchronize:             L A L·E(cuStreamSynchronize) A C A …
//!   the driver's own threads:          L C            (start_thread, clone)
//! libcuda's frames hold stale RAs of libc and of the application, so no single RA outside
//! libcuda marks the caller. What does: an entry-point RA whose next RA outside libcuda is in
//! the application (not libc). Failing that, an application RA whose call instruction can be
//! followed (`call rel32`, `call *[rip+disp]`, through one PLT stub) to an entry point — the
//! case of an entry point that tail-jumps into its implementation and leaves no frame.
//! A thread inside libcuda with application frames but neither kind of evidence is reported
//! as inside libcuda, entry point unknown; one with no application frames is a driver thread.

/// What the scanner needs to know about the target's code.
pub trait CodeView {
    /// The traced entry point whose body contains `addr`, if any.
    fn entry_point_at(&self, addr: u64) -> Option<u32>;
    fn in_libcuda(&self, addr: u64) -> bool;
    /// Inside any executable mapping.
    fn in_code(&self, addr: u64) -> bool;
    /// Inside runtime support — libc, the dynamic loader, libcupti: a caller there
    /// (start_thread, a CUPTI thread) means the thread is not an application thread inside an
    /// API call.
    fn in_runtime(&self, addr: u64) -> bool;
    /// Reads the target's memory; false if any byte is unreadable.
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool;
}

/// Where a thread is, as far as the stack tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    EntryPoint(u32),
    /// Inside libcuda, but no frame or caller names the entry point.
    UnknownEntryPoint,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Region {
    Libcuda,
    Runtime,
    App,
}

struct Ra {
    addr: u64,
    region: Region,
    call: Call,
    /// Where in the stack copy it was found (bytes from its start).
    off: usize,
}

/// Where the thread is in libcuda, or `None` if it is not inside libcuda.
pub fn entry_point(ip: u64, stack: &[u8], code: &impl CodeView) -> Option<Found> {
    entry_point_and_frame(ip, stack, code).map(|(f, _)| f)
}

/// `entry_point`, with where in `stack` the return address that told it lies (0 when the
/// instruction pointer did): the frames from there up are the caller's, which do not change
/// while the call lasts.
pub fn entry_point_and_frame(
    ip: u64,
    stack: &[u8],
    code: &impl CodeView,
) -> Option<(Found, usize)> {
    let region = |a: u64| {
        if code.in_libcuda(a) {
            Region::Libcuda
        } else if code.in_runtime(a) {
            Region::Runtime
        } else {
            Region::App
        }
    };
    let mut candidates = stack
        .as_chunks::<8>()
        .0
        .iter()
        .enumerate()
        .map(|(i, w)| (i * 8, u64::from_le_bytes(*w)))
        .filter(|&(_, a)| code.in_code(a))
        .filter_map(|(off, addr)| {
            Some(Ra {
                addr,
                region: region(addr),
                call: call_before(code, addr)?,
                off,
            })
        });
    // Validated lazily: each return address costs a read of the target's code, and a thread
    // sampled outside libcuda (most samples of a busy Python thread) is settled by its first
    // frame outside the runtime, not by all of the 8 KiB scanned (~9 µs a sample, 2026-12-06).
    // Inside libcuda: the ip is there, or libcuda frames come before any application frame
    // (libc frames may come first: sched_yield or a futex wait called by libcuda).
    let mut ras: Vec<Ra> = Vec::new();
    let ip_inside = code.in_libcuda(ip);
    if !ip_inside {
        loop {
            let r = candidates.next()?;
            let region = r.region;
            ras.push(r);
            if region == Region::Runtime {
                continue;
            }
            if region != Region::Libcuda {
                return None;
            }
            break;
        }
    }
    ras.extend(candidates);
    // Is the next RA outside libcuda, after index `i`, an application frame?
    let caller_is_app = |from: usize| {
        ras[from..]
            .iter()
            .find(|r| r.region != Region::Libcuda)
            .is_some_and(|r| r.region == Region::App)
    };
    if let Some(id) = code.entry_point_at(ip)
        && caller_is_app(0)
    {
        return Some((Found::EntryPoint(id), 0));
    }
    for (i, ra) in ras.iter().enumerate() {
        match ra.region {
            Region::Libcuda => {
                if let Some(id) = code.entry_point_at(ra.addr)
                    && caller_is_app(i + 1)
                {
                    return Some((Found::EntryPoint(id), ra.off));
                }
            }
            Region::App => {
                if let Some(id) =
                    call_target(code, ra.addr, ra.call).and_then(|t| code.entry_point_at(t))
                {
                    return Some((Found::EntryPoint(id), ra.off));
                }
            }
            Region::Runtime => {}
        }
    }
    ras.iter()
        .find(|r| r.region == Region::App)
        .map(|r| (Found::UnknownEntryPoint, r.off))
}

/// The words of a stack that point into code, innermost first, at most `max`: candidate
/// return addresses, kept per on-CPU sample at no cost beyond the scan (no reads of the
/// target). `is_return_address` validates them when a host-stall report needs the frames.
pub fn code_words(stack: &[u8], code: &impl CodeView, max: usize) -> Vec<u64> {
    stack
        .as_chunks::<8>()
        .0
        .iter()
        .map(|w| u64::from_le_bytes(*w))
        .filter(|&a| code.in_code(a))
        .take(max)
        .collect()
}

/// Whether `addr` follows a call instruction in the target's code (reads 7 bytes of it). A
/// scan, not an unwind: stale return addresses pass too.
pub fn is_return_address(code: &impl CodeView, addr: u64) -> bool {
    call_before(code, addr).is_some()
}

/// The validated return addresses of a stack, innermost first, tagged `L` (libcuda), `C`
/// (libc), `E<id>` (inside a traced entry point), `->target` (the call's target when it can
/// be followed): for `WEDGEPROBE_DEBUG_SCAN=1`, to see why a stack was read as it was.
pub fn explain(ip: u64, stack: &[u8], code: &impl CodeView) -> String {
    let mut out = format!("ip {ip:#x}{}", if code.in_libcuda(ip) { " L" } else { "" });
    for word in stack.as_chunks::<8>().0 {
        let addr = u64::from_le_bytes(*word);
        if !code.in_code(addr) {
            continue;
        }
        let Some(call) = call_before(code, addr) else {
            continue;
        };
        out.push_str(&format!(" | {addr:#x}"));
        if code.in_libcuda(addr) {
            out.push_str(" L");
        }
        if code.in_runtime(addr) {
            out.push_str(" C");
        }
        if let Some(id) = code.entry_point_at(addr) {
            out.push_str(&format!(" E{id}"));
        }
        if let Some(t) = call_target(code, addr, call) {
            out.push_str(&format!(" ->{t:#x}"));
        }
    }
    out
}

/// The form of the call instruction that ends just before a return address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    /// `E8 rel32`
    Direct(i32),
    /// `FF 15 disp32`: through a pointer at `[rip + disp32]`.
    RipIndirect(i32),
    /// `FF /2` through a register or a register-based address.
    Register,
}

/// The call instruction before `ret`, if there is one.
fn call_before(code: &impl CodeView, ret: u64) -> Option<Call> {
    let mut b = [0u8; 7];
    if !code.read(ret.checked_sub(7)?, &mut b) {
        return None;
    }
    let rel = |i: usize| i32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    if b[2] == 0xe8 {
        return Some(Call::Direct(rel(3)));
    }
    if b[1] == 0xff && b[2] == 0x15 {
        return Some(Call::RipIndirect(rel(3)));
    }
    let ff2 = |i: usize| b[i] == 0xff && (b[i + 1] >> 3) & 7 == 2;
    (ff2(5) || ff2(4) || ff2(1) || ff2(0)).then_some(Call::Register)
}

/// The function a call lands in, following one PLT stub.
fn call_target(code: &impl CodeView, ret: u64, call: Call) -> Option<u64> {
    let target = match call {
        Call::Direct(rel) => ret.wrapping_add_signed(rel as i64),
        Call::RipIndirect(disp) => read_u64(code, ret.wrapping_add_signed(disp as i64))?,
        Call::Register => return None,
    };
    if code.entry_point_at(target).is_some() {
        return Some(target);
    }
    plt_target(code, target).or(Some(target))
}

/// Follows a PLT stub: `[endbr64] [bnd] jmp *[rip+disp32]`.
fn plt_target(code: &impl CodeView, stub: u64) -> Option<u64> {
    let mut b = [0u8; 11];
    if !code.read(stub, &mut b) {
        return None;
    }
    let mut i = 0;
    if b[..4] == [0xf3, 0x0f, 0x1e, 0xfa] {
        i = 4; // endbr64
    }
    if b[i] == 0xf2 {
        i += 1; // bnd prefix
    }
    if b.get(i..i + 2)? != [0xff, 0x25] {
        return None;
    }
    let disp = i32::from_le_bytes(b.get(i + 2..i + 6)?.try_into().ok()?);
    let next = stub + i as u64 + 6;
    read_u64(code, next.wrapping_add_signed(disp as i64))
}

fn read_u64(code: &impl CodeView, addr: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    code.read(addr, &mut b).then(|| u64::from_le_bytes(b))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// libcuda code at 0x1000..0x9000 with cuLaunchKernel (id 0) at 0x2000..0x2100 and
    /// cuStreamSynchronize (id 8) at 0x3000..0x3100; the app at 0x10000..0x20000, libc at
    /// 0x30000..0x40000. Every address ending in 0x50 follows a `call rel32` to 0x6000 (an
    /// internal function) unless `mem` says otherwise.
    struct Fake {
        mem: HashMap<u64, u8>,
    }
    impl Fake {
        fn new() -> Self {
            Self {
                mem: HashMap::new(),
            }
        }
        fn put(&mut self, addr: u64, bytes: &[u8]) {
            for (i, b) in bytes.iter().enumerate() {
                self.mem.insert(addr + i as u64, *b);
            }
        }
    }
    impl CodeView for Fake {
        fn entry_point_at(&self, a: u64) -> Option<u32> {
            match a {
                0x2000..0x2100 => Some(0),
                0x3000..0x3100 => Some(8),
                _ => None,
            }
        }
        fn in_libcuda(&self, a: u64) -> bool {
            (0x1000..0x9000).contains(&a)
        }
        fn in_code(&self, a: u64) -> bool {
            self.in_libcuda(a) || (0x10000..0x40000).contains(&a)
        }
        fn in_runtime(&self, a: u64) -> bool {
            (0x30000..0x40000).contains(&a)
        }
        fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
            for (i, out) in buf.iter_mut().enumerate() {
                let a = addr + i as u64;
                *out = match self.mem.get(&a) {
                    Some(b) => *b,
                    None if a & 0xff == 0x50 - 5 => 0xe8,
                    None => 0x90,
                };
            }
            true
        }
    }

    fn stack(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// `Fake`, counting the reads of the target's code (each is a process_vm_readv).
    struct Counting {
        fake: Fake,
        reads: std::cell::Cell<u32>,
    }
    impl CodeView for Counting {
        fn entry_point_at(&self, a: u64) -> Option<u32> {
            self.fake.entry_point_at(a)
        }
        fn in_libcuda(&self, a: u64) -> bool {
            self.fake.in_libcuda(a)
        }
        fn in_code(&self, a: u64) -> bool {
            self.fake.in_code(a)
        }
        fn in_runtime(&self, a: u64) -> bool {
            self.fake.in_runtime(a)
        }
        fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
            self.reads.set(self.reads.get() + 1);
            self.fake.read(addr, buf)
        }
    }

    #[test]
    fn a_sample_outside_libcuda_is_settled_by_its_first_application_frame() {
        // A busy Python thread: ip in the app, 200 application return addresses on its
        // stack. Its first frame outside the runtime is the app's, so it is in no driver call
        // — told by one read of the target's code, not 200.
        let code = Counting {
            fake: Fake::new(),
            reads: Default::default(),
        };
        let words: Vec<u64> = (0..200).map(|i| 0x10050 + 0x100 * i).collect();
        assert_eq!(entry_point(0x10100, &stack(&words), &code), None);
        assert!(code.reads.get() <= 2, "{} reads", code.reads.get());
    }

    #[test]
    fn launch_spinning_in_sched_yield_is_found() {
        // ip in libc's sched_yield; internal libcuda frame; cuLaunchKernel's body; the app.
        let s = stack(&[0xdead, 0x5150, 0x42, 0x2050, 0x7, 0x10150, 0x3050]);
        assert_eq!(
            entry_point(0x30010, &s, &Fake::new()),
            Some(Found::EntryPoint(0))
        );
    }

    #[test]
    fn stale_words_above_the_caller_do_not_count() {
        // The 0x3050 (cuStreamSynchronize) word lies beyond the app's return address.
        let s = stack(&[0x2050, 0x10150, 0x3050]);
        assert_eq!(
            entry_point(0x5000, &s, &Fake::new()),
            Some(Found::EntryPoint(0))
        );
    }

    #[test]
    fn spinning_in_the_entry_point_body_itself() {
        let s = stack(&[0x10150]);
        assert_eq!(
            entry_point(0x3010, &s, &Fake::new()),
            Some(Found::EntryPoint(8))
        );
    }

    #[test]
    fn tail_call_is_followed_through_the_callers_plt_stub() {
        // The entry point jumped to internal code at 0x5000: no frame of its own. The app's
        // call at 0x10150 goes to a PLT stub at 0x11000 whose GOT slot at 0x12000 holds 0x3000.
        let mut f = Fake::new();
        let rel = (0x11000i64 - 0x10150) as i32;
        f.put(0x10150 - 5, &[0xe8]);
        f.put(0x10150 - 4, &rel.to_le_bytes());
        let disp = (0x12000i64 - (0x11000 + 4 + 1 + 6)) as i32;
        f.put(0x11000, &[0xf3, 0x0f, 0x1e, 0xfa, 0xf2, 0xff, 0x25]);
        f.put(0x11007, &disp.to_le_bytes());
        f.put(0x12000, &0x3000u64.to_le_bytes());
        let s = stack(&[0x5150, 0x10150]);
        assert_eq!(entry_point(0x5010, &s, &f), Some(Found::EntryPoint(8)));
    }

    #[test]
    fn call_through_a_register_leaves_the_entry_point_unknown() {
        let mut f = Fake::new();
        f.put(0x10150 - 7, &[0x90, 0x90, 0x90, 0x90, 0x90, 0xff, 0xd0]); // call *%rax
        let s = stack(&[0x5150, 0x10150]);
        assert_eq!(entry_point(0x5010, &s, &f), Some(Found::UnknownEntryPoint));
    }

    #[test]
    fn a_driver_thread_started_by_libc_is_not_in_an_api_call() {
        let mut f = Fake::new();
        f.put(0x30150 - 7, &[0x90, 0x90, 0x90, 0x90, 0x90, 0xff, 0xd0]); // start_thread: call *%rax
        let s = stack(&[0x5150, 0x30150]);
        assert_eq!(entry_point(0x5010, &s, &f), None);
    }

    #[test]
    fn stale_libc_and_app_words_inside_libcuda_frames_are_skipped() {
        // Shapes seen on the H200: L C L C L·E0 A (launch), L A L·E8 A (sync); the libc
        // (0x30150) and app (0x10250) words inside libcuda's frames are stale.
        let launch = stack(&[0x5150, 0x30150, 0x5250, 0x30250, 0x2050, 0x10150, 0x30350]);
        assert_eq!(
            entry_point(0x6000, &launch, &Fake::new()),
            Some(Found::EntryPoint(0))
        );
        let sync = stack(&[0x5150, 0x10250, 0x3050, 0x10150]);
        assert_eq!(
            entry_point(0x6000, &sync, &Fake::new()),
            Some(Found::EntryPoint(8))
        );
    }

    #[test]
    fn a_stale_entry_point_word_followed_by_libc_is_not_the_caller() {
        // 0x3050 (E8) is followed by a libc RA, so it is stale; 0x2050 (E0) is the real one.
        let s = stack(&[0x3050, 0x30150, 0x5150, 0x2050, 0x10150]);
        assert_eq!(
            entry_point(0x6000, &s, &Fake::new()),
            Some(Found::EntryPoint(0))
        );
    }

    #[test]
    fn words_that_do_not_follow_a_call_are_ignored() {
        // 0x2060 is inside cuLaunchKernel but is no return address; the thread is in the app.
        let s = stack(&[0x2060, 0x10150]);
        assert_eq!(entry_point(0x10000, &s, &Fake::new()), None);
    }

    #[test]
    fn a_thread_in_app_code_is_not_inside_libcuda() {
        let s = stack(&[0x10150, 0x10250, 0x10350, 0x10450, 0x2050, 0x10550]);
        assert_eq!(entry_point(0x10010, &s, &Fake::new()), None);
    }

    #[test]
    fn garbage_stacks_do_not_panic() {
        assert_eq!(entry_point(0, &[], &Fake::new()), None);
        let mut f = Fake::new();
        f.put(0x10150 - 5, &[0xe8, 0xff, 0xff, 0xff, 0x7f]);
        let s = stack(&[0x5150, 0x10150, u64::MAX]);
        assert!(entry_point(u64::MAX, &s, &f).is_some());
        assert_eq!(entry_point(u64::MAX, &[0xff; 13], &Fake::new()), None);
    }
}
