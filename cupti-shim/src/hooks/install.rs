//! Putting the hooks in and taking them out: libcuda's launch entry points (all or none) and
//! the other entry points the shim records (`super::calls`, each where it can be moved),
//! through trampolines (`super::patch_code`) — at `cuInit`, or prepared for `wedgeprobe
//! attach`, which writes the jumps itself while every thread is stopped.

use std::sync::{
    OnceLock,
    atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering, Ordering::*},
};

use probe_common::{
    api,
    journal::{STATE_OFF, STATE_RECORDING},
};

use super::{
    hot::{HOT, Resolve},
    launch::{ENTRIES, addresses},
    patch_code,
};
use crate::record::Recorder;

// Every entry point hooked has a slot in the one trampoline area.
const _: () = assert!(patch_code::SLOTS >= ENTRIES.len() + super::calls::N);

/// The patches applied, for `remove`.
static PATCHES: OnceLock<Vec<patch_code::Patch>> = OnceLock::new();

static TRIED: AtomicBool = AtomicBool::new(false);

/// Whether `install` ran already (successful or not).
pub fn tried() -> bool {
    TRIED.load(Ordering::Acquire)
}

/// Why the hooks are not in: what kind of reason (an attach reports it as its status) and the
/// line the log and `wedgeprobe attach` show.
#[derive(Debug)]
pub struct NotHooked {
    pub kind: NotHookedKind,
    pub line: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotHookedKind {
    /// No libcuda loaded, or it lacks a launch entry point.
    NoLibcuda,
    /// A launch entry point's code cannot be moved safely (`patch_code::Refusal`).
    Refused,
    /// A breakpoint (a uprobe, a debugger's) is on a launch entry point.
    Breakpoint,
    /// `WEDGEPROBE_SHIM_HOOKS=off`.
    TurnedOff,
    /// Not an x86-64 process.
    NotX86,
    /// Anything else: already tried, no memory near libcuda…
    Failed,
}

impl NotHooked {
    /// The journal's `CALLBACKS_*` code for it.
    pub fn callbacks_code(&self) -> u32 {
        use probe_common::journal::*;
        match self.kind {
            NotHookedKind::NoLibcuda => CALLBACKS_NO_ENTRY_POINT,
            NotHookedKind::Refused => CALLBACKS_CODE_REFUSED,
            NotHookedKind::Breakpoint => CALLBACKS_BREAKPOINT,
            NotHookedKind::TurnedOff => CALLBACKS_TURNED_OFF,
            NotHookedKind::NotX86 => CALLBACKS_NOT_X86,
            NotHookedKind::Failed => CALLBACKS_FAILED,
        }
    }

    /// Launches go through the driver's callbacks from now on: the journal says why (what
    /// `report`'s header and the daemon's metrics show), and the target's log in one line
    /// starting with `prefix`.
    pub fn fell_back(&self, prefix: &str) {
        if let Some(rec) = crate::record::get() {
            rec.writer()
                .set_flags(self.callbacks_code() << probe_common::journal::JOURNAL_CALLBACKS_SHIFT);
        }
        let mut line = prefix.as_bytes().to_vec();
        line.extend_from_slice(self.line.as_bytes());
        crate::log_line(&line);
    }
}

impl NotHooked {
    fn failed(why: &str) -> Self {
        Self {
            kind: NotHookedKind::Failed,
            line: why.to_string(),
        }
    }
}

impl From<&'static str> for NotHooked {
    fn from(why: &'static str) -> Self {
        Self::failed(why)
    }
}

/// Every patch, prepared: trampolines written and sealed, jumps not in place yet.
struct Prepared {
    launches: Vec<patch_code::Patch>,
    /// (index in `call_hooks`' table, patch).
    calls: Vec<(usize, patch_code::Patch)>,
}

/// Resolves the loaded libcuda's launch entry points (all of them, or `Err`), the other
/// entry points (`crate::hooks::calls`, each where it exists and can be moved) when
/// `with_calls`, and writes every trampoline.
fn prepare(resolve: Resolve, with_calls: bool) -> Result<Prepared, NotHooked> {
    if std::env::var("WEDGEPROBE_SHIM_HOOKS").is_ok_and(|v| v == "off" || v == "0") {
        return Err(NotHooked {
            kind: NotHookedKind::TurnedOff,
            line: "launch hooks turned off by WEDGEPROBE_SHIM_HOOKS".into(),
        });
    }
    // The trampolines move x86-64 instructions (`patch_code`): on another architecture say
    // so, rather than refuse libcuda's code.
    if cfg!(not(target_arch = "x86_64")) {
        return Err(NotHooked {
            kind: NotHookedKind::NotX86,
            line: "launch hooks are x86-64 only (this shim is built for another architecture)"
                .into(),
        });
    }
    // SAFETY: RTLD_NOLOAD only finds a libcuda the process has loaded already.
    let h = unsafe {
        libc::dlopen(
            c"libcuda.so.1".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        )
    };
    if h.is_null() {
        return Err(NotHooked {
            kind: NotHookedKind::NoLibcuda,
            line: "libcuda.so.1 is not loaded".into(),
        });
    }
    let mut targets = [0usize; 8];
    for (i, (_, name)) in ENTRIES.iter().enumerate() {
        // SAFETY: a valid handle and a NUL-terminated name.
        let p = unsafe { libc::dlsym(h, name.as_ptr()) } as usize;
        if p == 0 {
            return Err(NotHooked {
                kind: NotHookedKind::NoLibcuda,
                line: format!("libcuda lacks {}", name.to_string_lossy()),
            });
        }
        // SAFETY: an exported function's entry.
        if let Err(refusal) = unsafe { patch_code::plan_at(p) } {
            return Err(NotHooked {
                kind: if refusal.why == patch_code::BREAKPOINT {
                    NotHookedKind::Breakpoint
                } else {
                    NotHookedKind::Refused
                },
                line: format!(
                    "libcuda's {} cannot be hooked safely: {refusal}",
                    name.to_string_lossy()
                ),
            });
        }
        targets[i] = p;
        let id = api::id_of(name.to_str().unwrap_or_default()).ok_or("unknown entry point")?;
        let id = u8::try_from(id).map_err(|_| "entry point id out of range")?;
        HOT.api[i].store(id, Ordering::Relaxed);
    }
    if HOT.resolve.load(Ordering::Acquire).is_null() {
        // Leaked: read by every hooked launch until the process ends.
        HOT.resolve
            .store(Box::into_raw(Box::new(resolve)), Ordering::Release);
    }
    HOT.ctx_get_current.store(
        crate::driver::driver()
            .ctx_get_current
            .map_or(0, |f| f as usize),
        Ordering::Relaxed,
    );
    let mut page = patch_code::Page::near(targets[0])?;
    let ours = addresses();
    // Every trampoline is written and made executable before the first jump goes in.
    let mut launches = Vec::with_capacity(8);
    for i in 0..8 {
        launches.push(page.prepare(targets[i], ours[i]).map_err(|why| NotHooked {
            kind: NotHookedKind::Failed,
            line: format!("libcuda's {}: {why}", ENTRIES[i].1.to_string_lossy()),
        })?);
        HOT.original[i].store(launches[i].trampoline, Ordering::Release);
    }
    let mut calls = Vec::new();
    if with_calls {
        // A call entry point not hooked costs what it records (a wait unseen by the journal,
        // a graph not named): said, by name, in one line.
        let mut not_hooked = Vec::new();
        for (name, ours, i) in super::calls::entries() {
            // SAFETY: a valid handle and a NUL-terminated name.
            let p = unsafe { libc::dlsym(h, name.as_ptr()) } as usize;
            if p == 0 {
                continue; // an older driver without it: nothing calls it
            }
            match page.prepare(p, ours) {
                Ok(patch) => calls.push((i, patch)),
                Err(why) => not_hooked.push(format!("{} ({why})", name.to_string_lossy())),
            }
        }
        if !not_hooked.is_empty() {
            crate::log_line(
                format!(
                    "{} call entry points not hooked, their calls unrecorded: {}",
                    not_hooked.len(),
                    not_hooked.join(", ")
                )
                .as_bytes(),
            );
        }
    }
    page.seal()?;
    Ok(Prepared { launches, calls })
}

/// Patches every launch entry point of the loaded libcuda, or none. At `cuInit`, before any
/// launch can run. `Err` says why (the caller keeps CUPTI's callbacks and logs it).
pub fn install(resolve: Resolve, with_calls: bool) -> Result<(), NotHooked> {
    if HOT.active.load(Ordering::Acquire) {
        return Ok(());
    }
    TRIED.store(true, Ordering::Release);
    let Prepared { launches, calls } = prepare(resolve, with_calls)?;
    for (i, p) in launches.iter().enumerate() {
        // SAFETY: exported functions no thread runs yet (we are inside cuInit, before any
        // launch can be made); `ours[i]` has the entry's signature; the page is sealed.
        if let Err(why) = unsafe { p.apply() } {
            // Entries patched so far stay patched: they pass launches through unrecorded, and
            // CUPTI's callbacks record every launch as before.
            if i > 0 {
                HOT.pass.store(true, Ordering::SeqCst);
            }
            return Err(why.into());
        }
    }
    for (i, p) in &calls {
        super::calls::installed(*i, p.trampoline);
        // SAFETY: as above (inside cuInit); the wrapper passes any of these through.
        if unsafe { p.apply() }.is_err() {
            super::calls::installed(*i, 0);
        }
    }
    let mut all = launches;
    all.extend(calls.into_iter().map(|(_, p)| p));
    let _ = PATCHES.set(all);
    if let Some(rec) = crate::record::get() {
        rec.own_ids_from_now();
    }
    HOT.active.store(true, Ordering::Release);
    Ok(())
}

/// `wedgeprobe attach`: prepares every patch without applying it, and lists in `out` the code
/// words that apply them; wedgeprobe writes them while every thread of the process is stopped
/// (threads run here, and one could be half-way through a prologue the jump overwrites). The
/// hooks count as installed from now: a launch that reaches one is recorded. Returns how many
/// words there are.
pub fn prepare_for_attach(
    resolve: Resolve,
    out: &mut [probe_common::attach::PatchWord],
) -> Result<usize, NotHooked> {
    if TRIED.swap(true, Ordering::AcqRel) {
        return Err("the launch hooks were installed or tried already".into());
    }
    let Prepared { launches, calls } = prepare(resolve, true)?;
    let mut all = launches;
    let call_ids: Vec<usize> = calls.iter().map(|(i, _)| *i).collect();
    all.extend(calls.into_iter().map(|(_, p)| p));
    // A jump crossing an aligned word takes two.
    let words: Vec<_> = all.iter().flat_map(patch_code::Patch::words).collect();
    if words.len() > out.len() {
        return Err("more code words than an attach can carry".into());
    }
    for (k, i) in call_ids.iter().enumerate() {
        super::calls::installed(*i, all[8 + k].trampoline);
    }
    for (slot, (addr, old, new)) in out.iter_mut().zip(&words) {
        *slot = probe_common::attach::PatchWord {
            addr: *addr,
            old: *old,
            new: *new,
        };
    }
    let n = words.len();
    let _ = PATCHES.set(all);
    if let Some(rec) = crate::record::get() {
        rec.own_ids_from_now();
    }
    HOT.active.store(true, Ordering::Release);
    Ok(n)
}

/// After `prepare_for_attach`: how many of the patches' jumps are in place, of how many.
pub fn patches_in_place() -> (usize, usize) {
    let Some(patches) = PATCHES.get() else {
        return (0, 0);
    };
    (
        patches.iter().filter(|p| p.in_place()).count(),
        patches.len(),
    )
}

/// The shim stops recording for good (released, or the process exits): launches pass
/// through, and libcuda's entry points get their own bytes back where one store does it
/// (`patch_code::Patch::restore`) — wedgeprobe then traces launches with uprobes on them,
/// which work either way (the jump lies after the entry's first instruction).
pub fn remove() {
    HOT.pass.store(true, Ordering::SeqCst);
    if let Some(patches) = PATCHES.get() {
        let mut left = 0;
        // (An attach that never completed has some jumps not in place: only those are undone.)
        for p in patches.iter().filter(|p| p.in_place()) {
            // SAFETY: each was applied by `install`.
            match unsafe { p.restore() } {
                Ok(true) => {}
                Ok(false) => left += 1,
                Err(why) => {
                    let mut line = b"launch hooks: ".to_vec();
                    line.extend_from_slice(why.as_bytes());
                    crate::log_line(&line);
                }
            }
        }
        if left > 0 {
            crate::log_line(
                format!(
                    "launch hooks: {left} jumps cross a code word and stay in place, passing \
                     calls through (a uprobe on those entry points still works)"
                )
                .as_bytes(),
            );
        }
    }
}

/// An attach's jumps: none awaited, awaited (wedgeprobe writes them), or in place or given up.
const IDLE: u8 = 0;
const WAITING: u8 = 1;
const DONE: u8 = 2;

static PHASE: AtomicU8 = AtomicU8::new(IDLE);
static DEADLINE_NS: AtomicU64 = AtomicU64::new(0);

/// `prepare_for_attach` handed the jumps to wedgeprobe: the flush thread's `attach_tick`
/// watches for them until `deadline_ns` (CLOCK_MONOTONIC).
pub fn await_jumps(deadline_ns: u64) {
    DEADLINE_NS.store(deadline_ns, Relaxed);
    PHASE.store(WAITING, Release);
}

/// The flush thread, every tick: once an attach's jumps are all in place, the journal
/// records; past the deadline without them, the shim steps aside. One load when there is no
/// attach under way.
pub fn attach_tick(rec: &Recorder) {
    if PHASE.load(Acquire) != WAITING {
        return;
    }
    let now = crate::clock::monotonic_ns();
    let (in_place, all) = patches_in_place();
    if in_place == all && all > 0 {
        rec.writer().set_state(STATE_RECORDING);
        crate::log_line(
            format!("attached by wedgeprobe: recording ({all} entry points hooked)").as_bytes(),
        );
    } else if now > DEADLINE_NS.load(Relaxed) {
        remove();
        rec.writer().set_state(STATE_OFF);
        crate::log_line(
            format!(
                "attach did not complete ({in_place} of {all} hooks in place by its \
                 deadline); hooks taken back; shim off"
            )
            .as_bytes(),
        );
    } else {
        return;
    }
    PHASE.store(DONE, Release);
}
