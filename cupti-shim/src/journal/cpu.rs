//! Each recording thread's CPU clock, read once a second by the flush thread, and since when
//! it has kept a core busy written into its slot (`ThreadSlot::busy_since_ns`): what dates a
//! spin that began before wedgeprobe looked. From outside, /proc gives a thread's CPU over
//! its whole life only, and a life's average dates nothing in a server: on the H200
//! (2026-12-04) a tokenizer thread 1 s into its work read "100% CPU for 185 s" (a busy
//! serving thread's life), and a handshake spinning 13 s after 25 s of light serving
//! averaged under 80% and was missed.
//!
//! Off the launch path: one `clock_gettime` per claimed slot per second on the flush thread
//! (the slots of threads that called CUDA), one store when the state changes. A read of
//! another thread's CPU clock is a syscall: 6.1–6.2 µs on the 2-core dev VM (a C loop of
//! 200,000 reads, 2026-12-04, with the test suite running beside it) — for 16 CUDA threads
//! ~0.1 ms a second, 0.01% of a core.

use core::{mem::offset_of, sync::atomic::Ordering::*};

use probe_common::journal::{JOURNAL_CPU_SAMPLED, ThreadSlot};

use super::Writer;

/// How often the clocks are read.
pub const SAMPLE_EVERY_NS: u64 = 1_000_000_000;
/// The share of a core over the time since the spin began that keeps it a spin (the same
/// 80% wedgeprobe applies to its own /proc readings). Judged on the average since the start,
/// not per reading: a spinner sharing a core dips below it for a second now and then.
const BUSY_SHARE: f64 = 0.8;

/// The flush thread's previous readings, per slot (owned by that thread).
#[derive(Default)]
pub struct CpuSamples {
    /// Per slot: (tid, CPU ns at the last reading, CPU ns when its spin began).
    prev: Vec<(u32, u64, u64)>,
    last_ns: u64,
    passes: u32,
}

/// A thread's CPU clock (CLOCK_THREAD_CPUTIME_ID of another thread of this process, by tid:
/// Linux's MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)); `None` once it has exited.
fn thread_cpu_ns(tid: u32) -> Option<u64> {
    let clock = ((!tid).wrapping_shl(3) as i32) | 4 | 2;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; a bad clock id is an error return, nothing else.
    let ok = unsafe { libc::clock_gettime(clock, &mut ts) } == 0;
    ok.then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

impl Writer {
    /// Reads the clocks if a second has passed since the last reading.
    pub fn sample_cpu(&self, s: &mut CpuSamples, now_ns: u64) {
        if s.last_ns != 0 && now_ns.saturating_sub(s.last_ns) < SAMPLE_EVERY_NS {
            return;
        }
        let cap = self.layout.threads_cap as usize;
        if s.prev.len() != cap {
            // Once, on the flush thread.
            s.prev = vec![(0, 0, 0); cap];
        }
        let span = now_ns.saturating_sub(s.last_ns);
        for (i, prev) in s.prev.iter_mut().enumerate() {
            let off = self.thread_slot_off(i as u32);
            let tid = self
                .half(off + offset_of!(ThreadSlot, tid) as u64)
                .load(Acquire);
            if tid == 0 {
                continue;
            }
            let busy = self.word(off + offset_of!(ThreadSlot, busy_since_ns) as u64);
            let Some(cpu) = thread_cpu_ns(tid) else {
                busy.store(0, Relaxed);
                *prev = (0, 0, 0);
                continue;
            };
            let (ptid, pcpu, start_cpu) = *prev;
            let mut start = start_cpu;
            if ptid == tid && s.last_ns != 0 && span > 0 {
                let since = busy.load(Relaxed);
                if since == 0 {
                    if cpu.saturating_sub(pcpu) as f64 >= BUSY_SHARE * span as f64 {
                        busy.store(s.last_ns.max(1), Relaxed);
                        start = pcpu;
                    }
                } else {
                    let along = now_ns.saturating_sub(since) as f64;
                    if (cpu.saturating_sub(start_cpu) as f64) < BUSY_SHARE * along {
                        busy.store(0, Relaxed);
                    }
                }
            } else {
                busy.store(0, Relaxed);
            }
            *prev = (tid, cpu, start);
        }
        s.last_ns = now_ns;
        // From the second pass on, every slot's word says something.
        s.passes = s.passes.saturating_add(1);
        if s.passes == 2 {
            self.set_flags(JOURNAL_CPU_SAMPLED);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The clock of another thread of this process is readable by its tid, and it counts
    /// that thread's CPU, not the caller's.
    #[test]
    fn a_thread_clock_is_read_by_tid() {
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let h = std::thread::spawn(move || {
            tx.send(unsafe { libc::gettid() } as u32).unwrap();
            while !stop2.load(Relaxed) {
                core::hint::spin_loop();
            }
        });
        let tid = rx.recv().unwrap();
        let a = thread_cpu_ns(tid).expect("readable");
        std::thread::sleep(std::time::Duration::from_millis(300));
        let b = thread_cpu_ns(tid).expect("readable");
        stop.store(true, Relaxed);
        h.join().unwrap();
        // The spinner ran (on a 2-core machine, at least a share of the 300 ms).
        assert!(b - a > 50_000_000, "{}", b - a);
        // Tids stay under pid_max (at most 2^22): no thread has this one.
        assert_eq!(thread_cpu_ns(4_194_303), None, "no such thread");
    }
}
