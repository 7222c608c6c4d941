//! What a process holds that a long-running daemon must not let grow: BPF programs, links and
//! map entries, open files, threads — read from the kernel's own view (/proc fdinfo, the bpf
//! syscall), not from the daemon's word. Shared by the lifecycle tests and the churn bench.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    os::fd::{AsFd as _, AsRawFd as _},
};

/// The ids of `kind` (`prog_id`, `link_id`, `map_id`) in `pid`'s fdinfo.
pub fn bpf_ids(pid: u32, kind: &str) -> BTreeSet<u32> {
    let mut ids = BTreeSet::new();
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return ids;
    };
    let prefix = format!("{kind}:");
    for e in dir.flatten() {
        let Ok(info) = fs::read_to_string(e.path()) else {
            continue;
        };
        ids.extend(
            info.lines()
                .filter_map(|l| l.strip_prefix(prefix.as_str()))
                .filter_map(|v| v.trim().parse::<u32>().ok()),
        );
    }
    ids
}

/// Entries in each hash map `pid` holds, by map name (array maps have fixed sizes and are
/// left out; ring buffers have no keys).
pub fn hash_map_entries(pid: u32) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for id in bpf_ids(pid, "map_id") {
        let Ok(info) = aya::maps::MapInfo::from_id(id) else {
            continue;
        };
        let is_hash = matches!(
            info.map_type(),
            Ok(aya::maps::MapType::Hash | aya::maps::MapType::LruHash)
        );
        let Ok(data) = aya::maps::MapData::from_id(id) else {
            continue;
        };
        if !is_hash {
            continue;
        }
        let name = info.name_as_str().unwrap_or("?").to_string();
        *out.entry(name).or_default() += count_keys(&data, info.key_size() as usize);
    }
    out
}

/// Walks a map's keys with BPF_MAP_GET_NEXT_KEY (aya's typed maps need the key and value
/// types; this counts any map).
fn count_keys(map: &aya::maps::MapData, key_size: usize) -> usize {
    const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
    #[repr(C)]
    struct Attr {
        map_fd: u32,
        _pad: u32,
        key: u64,
        next_key: u64,
        _rest: [u64; 13],
    }
    let fd = map.fd().as_fd().as_raw_fd();
    let (mut key, mut next) = (vec![0u8; key_size.max(1)], vec![0u8; key_size.max(1)]);
    let mut n = 0;
    let mut first = true;
    loop {
        let attr = Attr {
            map_fd: fd as u32,
            _pad: 0,
            key: if first { 0 } else { key.as_ptr() as u64 },
            next_key: next.as_mut_ptr() as u64,
            _rest: [0; 13],
        };
        // SAFETY: attr points at buffers of the map's key size that live across the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_GET_NEXT_KEY,
                &attr as *const Attr,
                std::mem::size_of::<Attr>() as u32,
            )
        };
        if r != 0 || n > 10_000_000 {
            return n;
        }
        n += 1;
        first = false;
        std::mem::swap(&mut key, &mut next);
    }
}

pub fn open_fds(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

pub fn threads(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

/// The inode of the first of `pid`'s mappings whose /proc/PID/maps line contains `needle`.
pub fn mapped_inode(pid: u32, needle: &str) -> Option<u64> {
    fs::read_to_string(format!("/proc/{pid}/maps"))
        .ok()?
        .lines()
        .find(|l| l.contains(needle))?
        .split_whitespace()
        .nth(4)?
        .parse()
        .ok()
}

/// Bytes resident in `pid`'s page tables of `from..to` (bytes from each start) of every
/// mapping of file `inode`, one figure per mapping (the present bit of /proc/PID/pagemap,
/// readable by root): what of another process's file a reader keeps mapped.
pub fn resident_in_mappings(pid: u32, inode: u64, from: u64, to: u64) -> Vec<u64> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let page = 4096u64;
    let (Ok(maps), Ok(mut pagemap)) = (
        fs::read_to_string(format!("/proc/{pid}/maps")),
        fs::File::open(format!("/proc/{pid}/pagemap")),
    ) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let of_inode = |l: &&str| l.split_whitespace().nth(4) == Some(inode.to_string().as_str());
    for line in maps.lines().filter(of_inode) {
        let Some((start, end)) = line
            .split_whitespace()
            .next()
            .and_then(|r| r.split_once('-'))
            .and_then(|(a, b)| {
                Some((
                    u64::from_str_radix(a, 16).ok()?,
                    u64::from_str_radix(b, 16).ok()?,
                ))
            })
        else {
            continue;
        };
        let (lo, hi) = ((start + from).min(end), (start + to).min(end));
        let pages = (hi.saturating_sub(lo) / page) as usize;
        let mut entries = vec![0u8; pages * 8];
        if pagemap.seek(SeekFrom::Start(lo / page * 8)).is_err()
            || pagemap.read_exact(&mut entries).is_err()
        {
            continue;
        }
        let present = entries
            .as_chunks::<8>()
            .0
            .iter()
            .filter(|e| u64::from_le_bytes(**e) >> 63 == 1)
            .count() as u64;
        out.push(present * page);
    }
    out
}
