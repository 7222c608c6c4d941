//! Which driver entry point a thread is inside, from its instruction pointer and a copy of the
//! top of its stack.
//!
//! Needed for threads that were already waiting when wedgeprobe attached — the usual case at
//! 3 a.m.: their entry uprobe never fired. libcuda has no frame pointers, so the stack is
//! *scanned* (as Breakpad's stackwalker does when CFI is missing): a word counts as a return
//! address only if it points into executable code right after a `call` instruction. Going up
//! the stack, the innermost frames are libcuda internals (or libc's sched_yield); the first
//! return address that lands outside libcuda is the caller of the exported entry point, and
//! the last libcuda return address before it lies inside that entry point's own body.

/// What the scanner needs to know about the target's code.
pub trait CodeView {
    /// The traced entry point whose body contains `addr`, if any.
    fn entry_point_at(&self, addr: u64) -> Option<u32>;
    fn in_libcuda(&self, addr: u64) -> bool;
    /// Inside any executable mapping.
    fn in_code(&self, addr: u64) -> bool;
    /// The 7 bytes just below `addr` (a `call` is at most 7 bytes long).
    fn bytes_before(&self, addr: u64) -> Option<[u8; 7]>;
}

/// Return addresses outside libcuda tolerated before the first libcuda one: the thread may sit
/// in libc (sched_yield, a futex wait) called from libcuda.
const MAX_FOREIGN_FRAMES_BEFORE_LIBCUDA: usize = 3;

/// The id of the entry point the thread is inside, or `None` if it is not inside libcuda.
pub fn entry_point(ip: u64, stack: &[u8], code: &impl CodeView) -> Option<u32> {
    let mut inside = code.in_libcuda(ip);
    let mut found = code.entry_point_at(ip);
    let mut foreign = 0;
    for word in stack.chunks_exact(8) {
        let addr = u64::from_le_bytes(word.try_into().ok()?);
        if !code.in_code(addr) || !follows_call(code, addr) {
            continue;
        }
        if code.in_libcuda(addr) {
            inside = true;
            if let Some(id) = code.entry_point_at(addr) {
                found = Some(id);
            }
        } else if inside {
            // The caller of libcuda: the last entry point seen is the one it called.
            return found;
        } else {
            foreign += 1;
            if foreign > MAX_FOREIGN_FRAMES_BEFORE_LIBCUDA {
                return None;
            }
        }
    }
    if inside { found } else { None }
}

/// Whether the instruction before `addr` is a call (E8 rel32, or FF /2 in its register,
/// disp8, disp32 and SIB forms), i.e. `addr` is a plausible return address.
fn follows_call(code: &impl CodeView, addr: u64) -> bool {
    let Some(b) = code.bytes_before(addr) else { return false };
    let ff2 = |i: usize| b[i] == 0xff && (b[i + 1] >> 3) & 7 == 2;
    b[2] == 0xe8 || ff2(5) || ff2(4) || ff2(1) || ff2(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// libcuda code at 0x1000..0x9000 with cuLaunchKernel (id 0) at 0x2000..0x2100 and
    /// cuStreamSynchronize (id 8) at 0x3000..0x3100; the app at 0x10000..0x20000, libc at
    /// 0x30000..0x40000. Every address ending in 0x50 follows a call.
    struct Fake;
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
        fn bytes_before(&self, a: u64) -> Option<[u8; 7]> {
            Some(if a & 0xff == 0x50 { [0, 0, 0xe8, 1, 2, 3, 4] } else { [0x90; 7] })
        }
    }

    fn stack(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn launch_spinning_in_sched_yield_is_found() {
        // ip in libc's sched_yield; internal libcuda frame; cuLaunchKernel's body; the app.
        let s = stack(&[0xdead, 0x5150, 0x42, 0x2050, 0x7, 0x10150, 0x3050]);
        assert_eq!(entry_point(0x30010, &s, &Fake), Some(0));
    }

    #[test]
    fn stale_words_above_the_caller_do_not_count() {
        // The 0x3050 (cuStreamSynchronize) word lies beyond the app's return address.
        let s = stack(&[0x2050, 0x10150, 0x3050]);
        assert_eq!(entry_point(0x5000, &s, &Fake), Some(0));
    }

    #[test]
    fn spinning_in_the_entry_point_body_itself() {
        let s = stack(&[0x10150]);
        assert_eq!(entry_point(0x3010, &s, &Fake), Some(8));
    }

    #[test]
    fn words_that_do_not_follow_a_call_are_ignored() {
        // 0x2060 is inside cuLaunchKernel but is no return address.
        let s = stack(&[0x2060, 0x10150]);
        assert_eq!(entry_point(0x5000, &s, &Fake), None);
    }

    #[test]
    fn a_thread_in_app_code_is_not_inside_libcuda() {
        let s = stack(&[0x10150, 0x10250, 0x10350, 0x10450, 0x2050, 0x10550]);
        assert_eq!(entry_point(0x10010, &s, &Fake), None);
    }

    #[test]
    fn garbage_stacks_do_not_panic() {
        assert_eq!(entry_point(0, &[], &Fake), None);
        assert_eq!(entry_point(u64::MAX, &[0xff; 13], &Fake), None);
    }
}
