//! Every layout that crosses the eBPF↔user boundary.
//!
//! Both sides compile this crate: `probe-ebpf` for `bpfel-unknown-none`, `probe-user` for the
//! host with the `user` feature (which adds `aya::Pod`). Every type is `#[repr(C)]` and
//! padding-free on purpose: the verifier rejects reads of uninitialised padding and a hidden
//! hole would make the two sides disagree silently. The tests at the bottom pin sizes and
//! offsets, so a change to a layout is a deliberate one.
#![no_std]

pub mod api;
pub mod attach;
pub mod journal;

/// Map names, shared so user space finds what the eBPF object declares.
pub mod maps {
    pub const TARGETS: &str = "WP_TARGETS";
    pub const IN_CALL: &str = "WP_IN_CALL";
    pub const PENDING_NAME: &str = "WP_PENDING_NAME";
    pub const THREAD_YIELDS: &str = "WP_THREAD_YIELDS";
    pub const LAST_SAMPLE: &str = "WP_LAST_SAMPLE";
    pub const EVENTS: &str = "WP_EVENTS";
    pub const SAMPLES: &str = "WP_SAMPLES";
    pub const COUNTERS: &str = "WP_COUNTERS";
}

/// Program names (the kernel shows the first 15 bytes; `wp_` marks ours in `bpftool prog`).
pub mod programs {
    pub const CALL_ENTER: &str = "wp_call_enter";
    pub const CALL_EXIT: &str = "wp_call_exit";
    pub const NAME_ENTER: &str = "wp_name_enter";
    pub const NAME_EXIT: &str = "wp_name_exit";
    /// The same four in `uprobe.multi` / `uretprobe.multi` sections: one link per program and
    /// process (kernels with `uprobe_multi`, ≥ 6.6 with its process-wide pid filter).
    pub const CALL_ENTER_MULTI: &str = "wp_call_enter_m";
    pub const CALL_EXIT_MULTI: &str = "wp_call_exit_m";
    pub const NAME_ENTER_MULTI: &str = "wp_name_enter_m";
    pub const NAME_EXIT_MULTI: &str = "wp_name_exit_m";
    pub const SCHED_YIELD: &str = "wp_sched_yield";
    pub const ON_CPU: &str = "wp_on_cpu";
    pub const ALL: [&str; 10] = [
        CALL_ENTER,
        CALL_EXIT,
        NAME_ENTER,
        NAME_EXIT,
        CALL_ENTER_MULTI,
        CALL_EXIT_MULTI,
        NAME_ENTER_MULTI,
        NAME_EXIT_MULTI,
        SCHED_YIELD,
        ON_CPU,
    ];
}

/// Indexes into the `WP_COUNTERS` per-CPU array: every loss on the eBPF side is counted here,
/// user space sums the CPUs and shows them (nothing is dropped silently).
pub mod counters {
    /// A finished call could not be reported: the events ring was full.
    pub const CALL_EVENT_LOST: u32 = 0;
    /// A kernel-name event could not be reported: the events ring was full.
    pub const NAME_EVENT_LOST: u32 = 1;
    /// A stack sample could not be reported: the samples ring was full.
    pub const SAMPLE_LOST: u32 = 2;
    /// A call was entered but the in-call table was full, so it is not tracked.
    pub const IN_CALL_FULL: u32 = 3;
    /// A uretprobe fired with no matching entry (attached mid-call, or a lost entry).
    pub const EXIT_WITHOUT_ENTRY: u32 = 4;
    /// Reading the launch arguments from user memory failed.
    pub const ARG_READ_FAILED: u32 = 5;
    pub const LEN: u32 = 8;
    pub const NAMES: [&str; LEN as usize] = [
        "call_event_lost",
        "name_event_lost",
        "sample_lost",
        "in_call_table_full",
        "exit_without_entry",
        "arg_read_failed",
        "reserved6",
        "reserved7",
    ];
}

/// Capacity of the per-thread in-call table; a thread is in at most one tracked call at a time.
pub const MAX_THREADS: u32 = 16384;
/// Processes that can be watched at once.
pub const MAX_TARGETS: u32 = 1024;
/// Bytes of a kernel name kept from `cuModuleGetFunction`-like calls. Itanium-mangled CUTLASS
/// names run past 1 KiB; 256 keeps the prefix that tells them apart in practice and keeps the
/// ring record small.
pub const NAME_LEN: usize = 256;
/// Bytes of user stack copied with an on-CPU sample; enough to reach the exported driver
/// entry point from the spin loop (libcuda keeps its frames shallow; checked on the H200).
pub const SAMPLE_STACK_LEN: usize = 8192;

/// State of one thread while it is inside a tracked driver call (`WP_IN_CALL`, key: tid).
///
/// Written by the entry uprobe; the sched_yield tracepoint adds to `yields`; the uretprobe
/// turns it into a [`CallDone`] and deletes it. User space reads the table to see who is
/// inside what right now.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InCall {
    /// CLOCK_MONOTONIC ns (bpf_ktime_get_ns) at entry.
    pub start_ns: u64,
    /// `CUstream` argument (0 = legacy default stream, 2 = per-thread default).
    pub stream: u64,
    /// `CUfunction` for launches, `CUgraphExec` for graph launches, `CUevent` for event sync.
    pub handle: u64,
    /// Bytes for copies; shared memory bytes for launches.
    pub bytes: u64,
    /// sched_yield calls made by the thread while inside this call.
    pub yields: u64,
    /// CLOCK_MONOTONIC ns of the last of those yields (0: none).
    pub last_yield_ns: u64,
    pub tgid: u32,
    /// One of [`api`] ids.
    pub api: u32,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// [`CALL_OPEN_ENDED`] or 0.
    pub flags: u32,
    pub _pad: u32,
}

/// The entry point has no return probe (launches in the cheap mode): the entry stays in the
/// table after the call returns, until the thread's next traced call replaces it. User space
/// decides whether the thread is still inside from its sched_yield stream and stack samples.
pub const CALL_OPEN_ENDED: u32 = 1;
/// Set in the attach cookie (above the api id) of an entry probe with no return probe.
pub const COOKIE_OPEN_ENDED: u64 = 1 << 16;

/// Header of every record on the `WP_EVENTS` ring.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventHeader {
    /// [`EVENT_CALL_DONE`] or [`EVENT_KERNEL_NAME`].
    pub kind: u32,
    pub tid: u32,
    pub tgid: u32,
    pub _pad: u32,
}

pub const EVENT_CALL_DONE: u32 = 1;
pub const EVENT_KERNEL_NAME: u32 = 2;

/// A tracked driver call returned.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallDone {
    pub header: EventHeader,
    pub call: InCall,
    pub end_ns: u64,
    /// The CUresult the call returned.
    pub result: u64,
}

/// A function handle and the kernel name it was looked up by
/// (`cuModuleGetFunction`, `cuLibraryGetKernel`, `cuKernelGetFunction`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelName {
    pub header: EventHeader,
    pub handle: u64,
    /// For `cuKernelGetFunction`: the `CUkernel` the function came from (its name is already
    /// known under that handle); 0 otherwise.
    pub alias_of: u64,
    /// NUL-terminated (or cut at [`NAME_LEN`]).
    pub name: [u8; NAME_LEN],
}

/// Arguments of a name lookup saved at entry for the return probe (`WP_PENDING_NAME`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingName {
    /// Where the driver writes the handle (`CUfunction*` / `CUkernel*`).
    pub out_ptr: u64,
    /// `const char* name`, or the `CUkernel` for `cuKernelGetFunction`.
    pub name_or_kernel: u64,
    pub api: u32,
    pub _pad: u32,
}

/// An on-CPU sample of a watched thread that is not inside a call we saw begin: its user
/// registers and the top of its user stack, so user space can tell which driver entry point
/// it is spinning in (threads already blocked when wedgeprobe attached).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StackSample {
    pub header: SampleHeader,
    pub stack: [u8; SAMPLE_STACK_LEN],
}

/// The fixed part of a [`StackSample`]: user space reads it and borrows the stack in place.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SampleHeader {
    pub tid: u32,
    pub tgid: u32,
    pub time_ns: u64,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// Bytes of `stack` that hold user memory read from `sp` upwards.
    pub len: u64,
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of these are #[repr(C)], padding-free (pinned by the tests below) and valid
    // for any bit pattern, which is what aya::Pod requires.
    unsafe impl aya::Pod for super::InCall {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PendingName {}
}

#[cfg(test)]
mod tests {
    use core::mem::{offset_of, size_of};

    use super::*;

    #[test]
    fn layouts_are_pinned_and_padding_free() {
        assert_eq!(size_of::<InCall>(), 88);
        assert_eq!(offset_of!(InCall, tgid), 48);
        assert_eq!(offset_of!(InCall, grid), 56);
        assert_eq!(offset_of!(InCall, flags), 80);
        assert_eq!(size_of::<EventHeader>(), 16);
        assert_eq!(size_of::<CallDone>(), 16 + 88 + 16);
        assert_eq!(offset_of!(CallDone, end_ns), 104);
        assert_eq!(size_of::<KernelName>(), 16 + 16 + NAME_LEN);
        assert_eq!(size_of::<PendingName>(), 24);
        assert_eq!(size_of::<StackSample>(), 48 + SAMPLE_STACK_LEN);
        assert_eq!(offset_of!(StackSample, stack), 48);
    }

    #[test]
    fn api_names_cover_every_id() {
        for id in 0..api::COUNT {
            assert!(!api::name(id).is_empty());
            assert_eq!(api::id_of(api::name(id)), Some(id));
        }
        assert_eq!(api::id_of("cuNoSuchThing"), None);
    }
}
