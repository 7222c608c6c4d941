//! What `wedgeprobe attach` and the shim it injects into a running process hand each other:
//! one `AttachArgs` in the injection page. wedgeprobe fills the inputs and the magic; the
//! shim's `wedgeprobe_shim_attach` prepares its hooks without applying them and lists the
//! 8-byte code words that turn them on; wedgeprobe writes those words with every thread of the
//! process stopped (a thread cannot then be half-way through a patched prologue), and the
//! shim's flush thread sees them in place and starts recording — or, past the deadline with
//! any missing, takes back what is there and turns itself off.
//!
//! The shim runs inside a process it does not own and reads this from memory wedgeprobe
//! wrote; wedgeprobe (root) reads it back from a process that may be hostile by then: both
//! sides check the magic, and wedgeprobe checks every patch against the process's libcuda.

/// `AttachArgs::magic`.
pub const ATTACH_MAGIC: u64 = u64::from_le_bytes(*b"WPATTCH1");
/// Most code words one attach patches: 8 launch entry points and 33 other calls today, each
/// one aligned word or two when its 5-byte jump crosses a word boundary (the patcher moves
/// whole instructions, so where a jump lands is the driver's layout, not ours). 128 words
/// keep `AttachArgs` (3,296 bytes) inside the injection page's 4 KiB argument area.
pub const MAX_PATCHES: usize = 128;

/// `AttachArgs::status`.
pub const ATTACH_PREPARED: u32 = 0;
/// The shim is already recording in this process.
pub const ATTACH_ALREADY: u32 = 1;
/// The process has no libcuda loaded, or it lacks the launch entry points.
pub const ATTACH_NO_LIBCUDA: u32 = 2;
/// libcuda's entry points begin with code the shim does not move (another tool's hook, a
/// uprobe, an unknown driver build).
pub const ATTACH_HOOKS_REFUSED: u32 = 3;
/// The journal could not be created.
pub const ATTACH_NO_JOURNAL: u32 = 4;
/// Anything else (the message says what).
pub const ATTACH_FAILED: u32 = 5;

/// One aligned code word: `old` is what must be there, `new` what turns a hook on.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PatchWord {
    pub addr: u64,
    pub old: u64,
    pub new: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttachArgs {
    pub magic: u64,
    /// In: CLOCK_MONOTONIC ns by which the words are written; past it the shim backs out.
    pub commit_deadline_ns: u64,
    /// Out: `ATTACH_*`.
    pub status: u32,
    /// Out: valid entries of `patches`.
    pub npatches: u32,
    pub patches: [PatchWord; MAX_PATCHES],
    /// Out: why, when `status` is not `ATTACH_PREPARED` (NUL-terminated).
    pub message: [u8; 200],
}

impl Default for AttachArgs {
    fn default() -> Self {
        Self {
            magic: 0,
            commit_deadline_ns: 0,
            status: ATTACH_FAILED,
            npatches: 0,
            patches: [PatchWord::default(); MAX_PATCHES],
            message: [0; 200],
        }
    }
}

#[cfg(test)]
mod tests {
    use core::mem::{offset_of, size_of};

    use super::*;

    #[test]
    fn layout_is_pinned_and_padding_free() {
        assert_eq!(size_of::<PatchWord>(), 24);
        assert_eq!(offset_of!(AttachArgs, status), 16);
        assert_eq!(offset_of!(AttachArgs, patches), 24);
        assert_eq!(size_of::<AttachArgs>(), 24 + 24 * MAX_PATCHES + 200);
    }
}
