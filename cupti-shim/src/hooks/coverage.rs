//! The hook coverage check (`WEDGEPROBE_SHIM_VERIFY_HOOKS=1`, a validation switch): with
//! CUPTI's launch callbacks on beside the hooks, every launch CUPTI saw that no hook took is
//! a caller reaching the driver's launch path some other way.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Coverage check (`WEDGEPROBE_SHIM_VERIFY_HOOKS=1`, a validation switch): CUPTI's launch
/// callbacks stay on beside the hooks and count every launch CUPTI saw, and those that did
/// not come through a hook — a caller that reaches the driver's launch path some other way.
pub static VERIFY: AtomicBool = AtomicBool::new(false);
pub static SEEN_BY_CUPTI: AtomicU64 = AtomicU64::new(0);
pub static MISSED_BY_HOOKS: AtomicU64 = AtomicU64::new(0);

/// The coverage check's line, at exit.
pub fn coverage_line() -> Option<Vec<u8>> {
    if !VERIFY.load(Ordering::Relaxed) {
        return None;
    }
    Some(
        format!(
            "hook coverage: {} launches seen by CUPTI, {} of them not through the launch hooks",
            SEEN_BY_CUPTI.load(Ordering::Relaxed),
            MISSED_BY_HOOKS.load(Ordering::Relaxed)
        )
        .into_bytes(),
    )
}
