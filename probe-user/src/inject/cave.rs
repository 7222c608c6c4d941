//! Where the injection blob is written in the target: a *code cave*, the slack between the end
//! of an executable segment and the end of its last page. Those bytes are mapped executable
//! (the kernel maps whole pages) but are not part of the segment: no code jumps there. Writing
//! them through /proc/PID/mem gives that page a private copy (as a debugger's breakpoint does);
//! the file and every other process are untouched, and the original bytes are put back once
//! the blob has run (`commit::write_all`). A cave whose bytes differ from its file's is not
//! used: an attach that was killed left its blob there, and that blob may still be running
//! (it waits up to 10 s before it puts its thread back) — rewriting it under that thread
//! would crash it.
//!
//! Why not a new mapping: the only way to make one is a system call made *by a thread of the
//! target*, and a thread whose system call was replaced and that wedgeprobe, killed, did not
//! restore would return into its own code with the wrong result and registers (glibc's futex
//! wrappers abort on an unexpected result). The cave needs no call of the target's: the blob in
//! it maps its own page, on its own, and restores everything itself.

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
};

use object::{
    Endianness,
    elf::PF_X,
    read::elf::{ElfFile64, ProgramHeader as _},
};

use crate::process::target::{Mapping, parse_maps_line};

/// A cave: where, and the bytes it held.
#[derive(Clone, Debug)]
pub struct Cave {
    pub addr: u64,
    pub original: Vec<u8>,
}

/// The end (file offset) of every executable segment of the ELF file at `path`.
fn exec_segment_ends(path: &Path) -> Option<Vec<u64>> {
    // Headers only (libcuda is ~100 MB).
    let cache = object::read::ReadCache::new(fs::File::open(path).ok()?);
    let elf = ElfFile64::<Endianness, _>::parse(&cache).ok()?;
    let e = elf.endian();
    Some(
        elf.elf_program_headers()
            .iter()
            .filter(|p| p.p_type(e) == object::elf::PT_LOAD && p.p_flags(e) & PF_X != 0)
            .map(|p| p.p_offset(e) + p.p_filesz(e))
            .collect(),
    )
}

/// A cave of at least `len` bytes (16-aligned) in one of `pid`'s executable file mappings,
/// with the bytes it holds now. libc first (always there, and read before), then the others.
pub fn find(pid: u32, len: usize) -> Option<Cave> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let mut exec: Vec<Mapping> = maps
        .lines()
        .filter_map(parse_maps_line)
        .filter(|m| m.executable && m.path.starts_with('/'))
        .collect();
    exec.sort_by_key(|m| !m.path.contains("/libc.so"));
    let mut ends: HashMap<String, Option<Vec<u64>>> = HashMap::new();
    for m in exec {
        let host = PathBuf::from(format!("/proc/{pid}/root")).join(m.path.trim_start_matches('/'));
        let seg_ends = ends
            .entry(m.path.clone())
            .or_insert_with(|| exec_segment_ends(&host))
            .clone()
            .unwrap_or_default();
        let size = m.end - m.start;
        for end_off in seg_ends {
            // The segment must end inside this mapping (not past it: then the slack is not
            // mapped here).
            if end_off <= m.offset || end_off - m.offset >= size {
                continue;
            }
            let start = (m.start + (end_off - m.offset) + 15) & !15;
            if start + len as u64 + 16 > m.end {
                continue;
            }
            let mut original = vec![0u8; len];
            if crate::sys::read_process_memory(pid, start, &mut original).ok() != Some(len) {
                continue;
            }
            // As the file has them, or in use (see the module doc).
            let mut file_bytes = vec![0u8; len];
            use std::os::unix::fs::FileExt as _;
            let from_file = fs::File::open(&host)
                .and_then(|f| f.read_exact_at(&mut file_bytes, m.offset + (start - m.start)));
            if from_file.is_err() || file_bytes != original {
                continue;
            }
            return Some(Cave {
                addr: start,
                original,
            });
        }
    }
    None
}
