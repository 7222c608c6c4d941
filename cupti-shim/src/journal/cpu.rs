//! Each recording thread's CPU clock, read once a second by the flush thread, and since when
//! it has kept a core busy written into its slot (`ThreadSlot::busy_since_ns`): what dates a
//! spin that began before wedgeprobe looked. From outside, /proc gives a thread's CPU over
//! its whole life only, and a life's average dates nothing in a server: on the H200
//! (2026-12-04) a tokenizer thread 1 s into its work read "100% CPU for 185 s" (a busy
//! serving thread's life), and a handshake spinning 13 s after 25 s of light serving
//! averaged under 80% and was missed.
//!
//! Busy is wanting a core: on one, or runnable and waiting for one (the scheduler's run-queue
//! wait, `/proc/self/task/TID/schedstat`), as wedgeprobe judges its own readings. On-CPU time
//! alone called a spinner in a CPU-limited pod, or one of six sharing two cores, "not busy"
//! (29% on a core, 71% waiting: the stall matrix test on the dev VM), and `report` then took
//! the shim's word that its spin had just begun. Where /proc cannot be read the thread clock
//! (on-CPU only) is used, for every thread alike.
//!
//! Off the launch path: one reading per claimed slot per second on the flush thread (the
//! slots of threads that called CUDA), one store when the state changes. Measured on the
//! 2-core dev VM (C loops of 200,000, 2026-12-04): open+read+close of a schedstat file
//! 5.0–5.1 µs; another thread's CPU clock 6.1–6.2 µs (with the test suite beside it) — for
//! 16 CUDA threads ~0.1 ms a second, 0.01% of a core.

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
    /// Decided at the first reading: schedstat (wanted: on a core or waiting) for every
    /// thread, or where /proc cannot be read, the thread clocks (on a core only).
    schedstat: Option<bool>,
}

impl CpuSamples {
    fn read(&mut self, tid: u32) -> Option<u64> {
        let schedstat = *self
            .schedstat
            .get_or_insert_with(|| thread_wanted_ns(tid).is_some());
        if schedstat {
            thread_wanted_ns(tid)
        } else {
            thread_cpu_ns(tid)
        }
    }
}

/// What thread `tid` of this process has wanted of a core so far, ns: on one plus waiting
/// for one, from `/proc/self/task/TID/schedstat` ("on_cpu_ns run_delay_ns slices"). `None`:
/// not readable (the thread has exited, or /proc is not there). No allocation: the path is
/// built on the stack.
fn thread_wanted_ns(tid: u32) -> Option<u64> {
    let mut path = [0u8; 48];
    let mut n = 0;
    for b in b"/proc/self/task/" {
        path[n] = *b;
        n += 1;
    }
    let mut digits = [0u8; 10];
    let (mut d, mut v) = (0, tid);
    loop {
        digits[d] = b'0' + (v % 10) as u8;
        d += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    while d > 0 {
        d -= 1;
        path[n] = digits[d];
        n += 1;
    }
    for b in b"/schedstat" {
        path[n] = *b;
        n += 1;
    }
    // SAFETY: `path` is NUL-terminated (zeroed past `n`, n ≤ 16 + 10 + 10 < 48).
    let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let mut buf = [0u8; 96];
    // SAFETY: `buf` is valid for its length; `fd` is ours and closed right after.
    let len = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    // SAFETY: closing the fd opened above.
    unsafe { libc::close(fd) };
    if len <= 0 {
        return None;
    }
    parse_wanted(&buf[..len as usize])
}

/// The sum of the first two numbers of a schedstat line.
fn parse_wanted(line: &[u8]) -> Option<u64> {
    let mut fields = line
        .split(|b| b.is_ascii_whitespace())
        .filter(|f| !f.is_empty())
        .map(|f| {
            f.iter().try_fold(0u64, |acc, b| {
                b.is_ascii_digit()
                    .then(|| acc.checked_mul(10)?.checked_add((b - b'0') as u64))
                    .flatten()
            })
        });
    let on = fields.next()??;
    let waiting = fields.next()??;
    on.checked_add(waiting)
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
        for i in 0..cap {
            let off = self.thread_slot_off(i as u32);
            let tid = self
                .half(off + offset_of!(ThreadSlot, tid) as u64)
                .load(Acquire);
            if tid == 0 {
                continue;
            }
            let busy = self.word(off + offset_of!(ThreadSlot, busy_since_ns) as u64);
            let Some(cpu) = s.read(tid) else {
                busy.store(0, Relaxed);
                s.prev[i] = (0, 0, 0);
                continue;
            };
            let (ptid, pcpu, start_cpu) = s.prev[i];
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
            s.prev[i] = (tid, cpu, start);
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

    /// A thread's schedstat is read by tid, with the wait: a spinner keeps growing it; a
    /// malformed line is no number.
    #[test]
    fn a_threads_wanted_time_is_read_from_its_schedstat() {
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() } as u32;
        let a = thread_wanted_ns(me).expect("readable");
        let until = std::time::Instant::now() + std::time::Duration::from_millis(100);
        while std::time::Instant::now() < until {
            core::hint::spin_loop();
        }
        let b = thread_wanted_ns(me).expect("readable");
        assert!(b - a >= 50_000_000, "{}", b - a);
        assert_eq!(thread_wanted_ns(4_194_303), None, "no such thread");
        assert_eq!(parse_wanted(b"120 30 7\n"), Some(150));
        assert_eq!(parse_wanted(b"120\n"), None);
        assert_eq!(parse_wanted(b"12x 30 7\n"), None);
        assert_eq!(parse_wanted(b"18446744073709551615 1 1"), None);
    }

    /// The clock of another thread of this process is readable by its tid, and it counts
    /// that thread's CPU, not the caller's.
    #[test]
    fn a_thread_clock_is_read_by_tid() {
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let h = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() } as u32).unwrap();
            while !stop2.load(Relaxed) {
                core::hint::spin_loop();
            }
        });
        let tid = rx.recv().unwrap();
        let a = thread_cpu_ns(tid).expect("readable");
        // The spinner's clock passes 50 ms while this thread sleeps (whose own clock would
        // not move). Waited for rather than timed: on a loaded machine (load 20 on 2 cores,
        // 2026-12-06) 300 ms of wall time gave the spinner less than 50 ms of CPU.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut b = a;
        while b - a <= 50_000_000 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(100));
            b = thread_cpu_ns(tid).expect("readable");
        }
        stop.store(true, Relaxed);
        h.join().unwrap();
        assert!(b - a > 50_000_000, "{}", b - a);
        // Tids stay under pid_max (at most 2^22): no thread has this one.
        assert_eq!(thread_cpu_ns(4_194_303), None, "no such thread");
    }
}
