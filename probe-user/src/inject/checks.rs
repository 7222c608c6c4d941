//! What must hold before `wedgeprobe attach` touches a process, each refusal one clear line:
//! the process is a CUDA process of our architecture that no shim and no other injection
//! library is in, it can be traced, and the library to inject is one only root could have
//! put there. Also where the target's `dlopen` and `dlsym` are.

use std::{
    fs,
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use object::{Object as _, ObjectSegment as _, ObjectSymbol as _, read::ReadCache};

use super::error::InjectError;
use crate::{process::target::Target, sys};

/// `/proc/PID/exe` is an x86-64 ELF (the blob and the stack scanner are x86-64 only).
pub fn architecture(pid: u32) -> Result<(), InjectError> {
    let mut head = [0u8; 20];
    let ok = fs::File::open(format!("/proc/{pid}/exe")).and_then(|mut f| {
        use std::io::Read as _;
        f.read_exact(&mut head)
    });
    if ok.is_err() {
        return Err(InjectError::Refused(format!(
            "cannot read the executable of pid {pid} to check its architecture"
        )));
    }
    let machine = u16::from_le_bytes([head[18], head[19]]);
    if &head[..4] != b"\x7fELF" || head[4] != 2 || machine != 62 {
        return Err(InjectError::Refused(format!(
            "pid {pid} is not an x86-64 process (ELF machine {machine}); attach injects x86-64 code"
        )));
    }
    Ok(())
}

/// No shim (ours, under any path) and no injection library configured: a process started with
/// `CUDA_INJECTION64_PATH` has that tool (Nsight Systems, our shim, a CUPTI injection) holding
/// the driver's one CUPTI subscriber before CUDA 13.3, and our hooks would sit beside it.
pub fn not_instrumented(target: &Target) -> Result<(), InjectError> {
    let pid = target.pid;
    if target.journal.is_some() {
        return Err(InjectError::Refused(format!(
            "pid {pid} already records with wedgeprobe's shim (its journal is mapped)"
        )));
    }
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    if maps
        .lines()
        .any(|l| l.contains("libcupti_shim") || l.contains("/memfd:wedgeprobe-shim"))
    {
        return Err(InjectError::Refused(format!(
            "pid {pid} already has wedgeprobe's shim loaded"
        )));
    }
    let env = fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    if let Some(path) = env
        .split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(b"CUDA_INJECTION64_PATH="))
        .filter(|p| !p.is_empty())
    {
        return Err(InjectError::Refused(format!(
            "pid {pid} was started with CUDA_INJECTION64_PATH={} (an injection library that \
             may hold the process's CUPTI subscriber); not attaching beside it",
            String::from_utf8_lossy(path)
        )));
    }
    Ok(())
}

/// No breakpoint on a traced entry point: an `int3` there is a uprobe (a running `wedgeprobe
/// watch`, `report` or daemon puts them on launches and synchronizes) or a debugger's, and
/// the shim's hooks cannot go in beside it. Found on the H200 (2026-12-01): an attach after
/// the daemon had started watching the process got as far as the shim, which refused with
/// "instructions the shim does not move" — said here first, with what to do.
pub fn no_breakpoints(
    pid: u32,
    entries: impl IntoIterator<Item = (u64, &'static str)>,
) -> Result<(), InjectError> {
    let entries: Vec<(u64, &'static str)> = entries.into_iter().collect();
    let carrying = || -> Vec<&'static str> {
        entries
            .iter()
            .filter(|&&(addr, _)| {
                let mut b = [0u8; 1];
                matches!(sys::read_process_memory(pid, addr, &mut b), Ok(1)) && b[0] == 0xcc
            })
            .map(|&(_, name)| name)
            .collect()
    };
    let mut on = carrying();
    // A watch, report or daemon that has just exited leaves its uprobes for a few seconds:
    // the kernel takes them out after a grace period (here, kernel 6.18: ~4 s after `watch`
    // ended, `attach` still found every breakpoint). With no other wedgeprobe running they are
    // going, so wait for them (up to 10 s) rather than refuse.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !on.is_empty() && !other_wedgeprobe_running() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(200));
        on = carrying();
    }
    if let Some(first) = on.first() {
        return Err(InjectError::Refused(format!(
            "pid {pid}: {} of libcuda's entry points ({first}{}) carry a breakpoint — uprobes of \
             a wedgeprobe watch, report or daemon already watching it, or a debugger; attach \
             before watching (or set `inject = true` in the daemon), not after",
            on.len(),
            if on.len() > 1 { ", …" } else { "" }
        )));
    }
    Ok(())
}

/// Whether a wedgeprobe process other than this one is running and not exiting (its
/// uprobes stay while it runs).
fn other_wedgeprobe_running() -> bool {
    let me = std::process::id();
    let Ok(dir) = fs::read_dir("/proc") else {
        return true;
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| p != me)
        .any(|p| {
            // One that is exiting is closing its probes: that is the wait above.
            fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "wedgeprobe")
                && !crate::process::target::exiting(p)
        })
}

/// Whether this process may trace `pid`, named when not: Yama's `ptrace_scope`, the
/// capability, another tracer.
pub fn traceable(pid: u32) -> Result<(), InjectError> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    if let Some(tracer) = status
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))
        .and_then(|v| v.trim().parse::<u32>().ok())
        .filter(|&t| t != 0)
    {
        return Err(InjectError::Refused(format!(
            "pid {pid} is being traced by pid {tracer} (a debugger?); only one tracer at a time"
        )));
    }
    let scope = fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(0);
    if scope >= 3 {
        return Err(InjectError::NotTraceable(
            "Yama's ptrace_scope is 3 (kernel.yama.ptrace_scope): no process may be traced on \
             this machine until reboot"
                .into(),
        ));
    }
    if sys::effective_capabilities() & (1 << sys::CAP_SYS_PTRACE) == 0 {
        return Err(InjectError::MissingCapability {
            capability: "CAP_SYS_PTRACE",
            why: "needed to take over a thread of another process",
        });
    }
    Ok(())
}

/// Reads the shim to inject, once it is shown to be a regular file owned by root and not
/// writable by anyone else, in directories the same holds for (sticky ones like /tmp aside:
/// there only a file's owner may replace it). Its bytes are read from the very file checked
/// (the open descriptor), so no one can swap it in between.
pub fn shim_image(path: &Path) -> Result<Vec<u8>, InjectError> {
    let bad = |why: String| InjectError::UnsafeShim {
        path: path.to_path_buf(),
        why,
    };
    let real = fs::canonicalize(path).map_err(|e| bad(format!("cannot resolve it: {e}")))?;
    let mut dir = real.parent();
    while let Some(d) = dir {
        let m = fs::metadata(d).map_err(|e| bad(format!("{}: {e}", d.display())))?;
        let mode = m.permissions().mode();
        let sticky = mode & 0o1000 != 0;
        if m.uid() != 0 || (mode & 0o022 != 0 && !sticky) {
            return Err(bad(format!(
                "its directory {} is {} and mode {:o}: someone other than root could replace it",
                d.display(),
                if m.uid() == 0 {
                    "root's".to_string()
                } else {
                    format!("owned by uid {}", m.uid())
                },
                mode & 0o7777
            )));
        }
        dir = d.parent();
    }
    use std::io::Read as _;
    let mut f = fs::File::open(&real).map_err(|e| bad(format!("cannot open it: {e}")))?;
    let m = f.metadata().map_err(|e| bad(format!("{e}")))?;
    if !m.is_file() {
        return Err(bad("not a regular file".into()));
    }
    if m.uid() != 0 || m.permissions().mode() & 0o022 != 0 {
        return Err(bad(format!(
            "owned by uid {} with mode {:o}: it must be root's and writable by root alone",
            m.uid(),
            m.permissions().mode() & 0o7777
        )));
    }
    let mut image = Vec::with_capacity(m.len() as usize);
    f.read_to_end(&mut image)
        .map_err(|e| bad(format!("cannot read it: {e}")))?;
    if image.get(..4) != Some(b"\x7fELF") {
        return Err(bad("not an ELF file".into()));
    }
    Ok(image)
}

/// The target's `dlopen` and `dlsym`: in its libc (glibc 2.34 and later), else in libdl.
pub fn dl_functions(pid: u32) -> Result<(u64, u64), InjectError> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps"))
        .map_err(|_| InjectError::TargetExited { pid })?;
    let all: Vec<crate::process::target::Mapping> = maps
        .lines()
        .filter_map(crate::process::target::parse_maps_line)
        .collect();
    for lib in ["libc.so.6", "libdl.so.2"] {
        let Some(first) = all
            .iter()
            .find(|m| m.offset == 0 && m.path.rsplit('/').next() == Some(lib))
        else {
            continue;
        };
        let host =
            PathBuf::from(format!("/proc/{pid}/root")).join(first.path.trim_start_matches('/'));
        if let Ok((open, sym)) = resolve(&host, first.start) {
            return Ok((open, sym));
        }
    }
    Err(InjectError::Refused(format!(
        "no dlopen/dlsym found in pid {pid}'s libc or libdl (not glibc?): attach needs them"
    )))
}

/// `dlopen` and `dlsym` in the library file at `path`, mapped with its first byte at `start`.
fn resolve(path: &Path, start: u64) -> anyhow::Result<(u64, u64)> {
    let file = fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    let cache = ReadCache::new(file);
    let obj = object::File::parse(&cache).context("parse")?;
    let first_vaddr = obj
        .segments()
        .find(|s| s.file_range().0 == 0)
        .map(|s| s.address())
        .unwrap_or(0);
    let bias = start.wrapping_sub(first_vaddr);
    let find = |name: &str| {
        obj.dynamic_symbols()
            .find(|s| s.name() == Ok(name) && s.is_definition() && s.address() != 0)
            .map(|s| bias.wrapping_add(s.address()))
    };
    Ok((
        find("dlopen").context("no dlopen")?,
        find("dlsym").context("no dlsym")?,
    ))
}
