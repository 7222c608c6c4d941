//! The stack scanner reads a target's stack and code bytes: memory an untrusted (and possibly
//! corrupted) process controls. Any input must give an answer, never a panic or a hang.
//!
//! Input: 8 bytes of instruction pointer, up to 4 KiB of "code" mapped at CODE_BASE
//! (libcuda's first half with two entry points, libc, then the application), the rest is
//! the stack.
#![no_main]

use libfuzzer_sys::fuzz_target;
use probe_user::process::stackscan::{self, CodeView};

const CODE_BASE: u64 = 0x7f00_0000_0000;
const CODE_LEN: usize = 4096;

struct Memory<'a> {
    code: &'a [u8],
}

impl CodeView for Memory<'_> {
    fn entry_point_at(&self, addr: u64) -> Option<u32> {
        match addr.checked_sub(CODE_BASE)? {
            0x100..0x200 => Some(0),
            0x300..0x380 => Some(8),
            _ => None,
        }
    }
    fn in_libcuda(&self, addr: u64) -> bool {
        (CODE_BASE..CODE_BASE + 2048).contains(&addr)
    }
    fn in_code(&self, addr: u64) -> bool {
        (CODE_BASE..CODE_BASE + CODE_LEN as u64).contains(&addr)
    }
    fn in_runtime(&self, addr: u64) -> bool {
        (CODE_BASE + 2048..CODE_BASE + 3072).contains(&addr)
    }
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        let Some(off) = addr.checked_sub(CODE_BASE) else { return false };
        let Some(src) = usize::try_from(off)
            .ok()
            .and_then(|o| self.code.get(o..o.checked_add(buf.len())?))
        else {
            return false;
        };
        buf.copy_from_slice(src);
        true
    }
}

fuzz_target!(|data: &[u8]| {
    let mut ip = [0u8; 8];
    let head = data.len().min(8);
    ip[..head].copy_from_slice(&data[..head]);
    let ip = u64::from_le_bytes(ip);
    let rest = &data[head..];
    let (code, stack) = rest.split_at(rest.len().min(CODE_LEN));
    let mem = Memory { code };
    let _ = stackscan::entry_point(ip, stack, &mem);
    let _ = stackscan::entry_point(CODE_BASE.wrapping_add(ip % 4096), stack, &mem);
    let _ = stackscan::explain(ip, stack, &mem);
});
