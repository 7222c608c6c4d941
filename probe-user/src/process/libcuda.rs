//! Where the traced entry points live in a given libcuda.
//!
//! Resolved once per library file, from its ELF dynamic symbols (what `dlsym` and
//! `cuGetProcAddress` hand out), into file offsets for the uprobes and sizes for the stack
//! scan. Different drivers export different sets: a missing symbol is skipped with a note.
//! libcuda is ~100 MB; `ReadCache` reads only the headers and symbol tables.

use std::{fs::File, path::Path};

use anyhow::Context as _;
use object::{Object as _, ObjectSegment as _, ObjectSymbol as _, read::ReadCache};
use probe_common::api;

/// A traced function in the library file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryPoint {
    pub symbol: &'static str,
    /// `probe_common::api` id, or a name-lookup cookie.
    pub id: u32,
    pub file_offset: u64,
    pub size: u64,
}

#[derive(Clone, Debug, Default)]
pub struct LibCuda {
    /// Wait points (launch, sync, copy), one per distinct address.
    pub waits: Vec<EntryPoint>,
    /// cuModuleGetFunction and friends.
    pub name_lookups: Vec<EntryPoint>,
    /// Traced symbols this library does not export.
    pub missing: Vec<&'static str>,
    /// Symbols that share an address with another traced one (traced under the first name).
    pub aliases: Vec<(&'static str, &'static str)>,
}

impl LibCuda {
    pub fn resolve(path: &Path) -> anyhow::Result<Self> {
        let file =
            File::open(path).with_context(|| format!("failed to open {}", path.display()))?;
        let cache = ReadCache::new(file);
        let obj = object::File::parse(&cache).with_context(|| {
            format!("{} is not an ELF file wedgeprobe can read", path.display())
        })?;
        let segments: Vec<(u64, u64, u64)> = obj
            .segments()
            .map(|s| (s.address(), s.size(), s.file_range().0))
            .collect();
        let mut found = std::collections::HashMap::new();
        for sym in obj.dynamic_symbols().chain(obj.symbols()) {
            let Ok(name) = sym.name() else { continue };
            if sym.address() == 0 || !sym.is_definition() {
                continue;
            }
            let Some(off) = segments.iter().find_map(|&(addr, size, file)| {
                (sym.address() >= addr && sym.address() - addr < size)
                    .then(|| sym.address() - addr + file)
            }) else {
                continue;
            };
            found.entry(name.to_string()).or_insert((off, sym.size()));
        }
        Ok(Self::from_symbols(|name| found.get(name).copied()))
    }

    /// Builds the table from a symbol lookup (name → (file offset, size)); split out so the
    /// alias and missing-symbol rules are unit-tested without an ELF file.
    pub fn from_symbols(lookup: impl Fn(&str) -> Option<(u64, u64)>) -> Self {
        let mut lib = Self::default();
        for (id, (symbol, _, _)) in api::TABLE.iter().enumerate() {
            match lookup(symbol) {
                Some((file_offset, size)) => {
                    if let Some(first) = lib.waits.iter().find(|e| e.file_offset == file_offset) {
                        lib.aliases.push((symbol, first.symbol));
                    } else {
                        lib.waits.push(EntryPoint {
                            symbol,
                            id: id as u32,
                            file_offset,
                            size,
                        });
                    }
                }
                None => lib.missing.push(symbol),
            }
        }
        for &(symbol, id) in api::NAME_LOOKUPS {
            match lookup(symbol) {
                Some((file_offset, size)) => lib.name_lookups.push(EntryPoint {
                    symbol,
                    id,
                    file_offset,
                    size,
                }),
                None => lib.missing.push(symbol),
            }
        }
        lib
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_are_traced_once_and_missing_symbols_listed() {
        let lib = LibCuda::from_symbols(|n| match n {
            "cuLaunchKernel" => Some((0x1000, 64)),
            "cuLaunchKernel_ptsz" => Some((0x1000, 64)),
            "cuStreamSynchronize" => Some((0x2000, 32)),
            "cuModuleGetFunction" => Some((0x3000, 16)),
            _ => None,
        });
        assert_eq!(lib.waits.len(), 2);
        assert_eq!(lib.aliases, vec![("cuLaunchKernel_ptsz", "cuLaunchKernel")]);
        assert!(lib.missing.contains(&"cuGraphLaunch"));
        assert_eq!(lib.name_lookups.len(), 1);
    }
}
