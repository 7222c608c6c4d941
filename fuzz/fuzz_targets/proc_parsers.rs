//! /proc/PID/maps and /proc/PID/task/TID/syscall of a target: paths and comm names in them
//! are the target's to choose. Any text must parse or be skipped, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for line in text.lines() {
        if let Some(m) = probe_user::process::target::parse_maps_line(line) {
            assert!(m.end > m.start);
            let _ = probe_user::process::target::is_libcuda(&m.path);
        }
    }
    let _ = probe_user::collect::collector::parse_syscall_regs(&text);
});
