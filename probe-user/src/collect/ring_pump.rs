//! Reads the shim journals' rings on a thread of its own while `trace` runs, so that the
//! trace keeps every record, and counts exactly those it cannot keep.
//!
//! A journal's ring holds 16,384 records (`Layout::DEFAULT`); under a per-kernel lease a
//! launch-bound loop on the simulated driver writes ~270k records a second, a 200-node CUDA
//! graph replaying 3,500 times a second on the H200 ~700k: one lap of the ring every 25–60
//! ms. The engine read the ring once a tick (50 ms, longer while it writes JSON), and a 3 s
//! trace kept ~71% of the launches and ~29% of the H200 graph's kernels while saying only
//! `wrote N events`. Here a thread copies new records out every `PERIOD` into a buffer the
//! engine drains at its own pace; records the ring overwrote before they were copied, and
//! records that found the buffer full (`CAPACITY`: the engine fell behind for long), are
//! counted, and each gap is kept with its time for the trace to show where it is.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use probe_common::journal::RingRecord;

use crate::journal::{MappedJournal, RingRead};

/// How often the pump reads every ring: a ring lap at 700k records/s is ~23 ms.
const PERIOD: Duration = Duration::from_millis(2);
/// Records held for the engine at most, all journals together (~53 MB): a second and more
/// of the fastest workload measured, for the engine to catch up after a slow tick.
const CAPACITY: usize = 512 * 1024;

/// A run of records that never reached the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gap {
    /// Time of the first record read after it (or of the read that found it).
    pub at_ns: u64,
    /// Overwritten in the ring before the pump read them.
    pub overwritten: u64,
    /// Read, but the buffer was full.
    pub buffer_full: u64,
}

/// What the pump has for one journal since the last `take`.
#[derive(Default)]
pub struct Taken {
    pub read: RingRead,
    pub gaps: Vec<Gap>,
    /// Per stream, the highest record number among records dropped for a full buffer: seen
    /// but not kept, so a loss at the very end of a trace is still put on its stream.
    pub dropped_upto: Vec<(u32, u64)>,
}

struct Pumped {
    journal: Arc<MappedJournal>,
    buf: Buffered,
}

/// One journal's records read and not yet taken.
#[derive(Default)]
struct Buffered {
    next: u64,
    window_from: u64,
    history_unread: u64,
    records: Vec<RingRecord>,
    lost: u64,
    gaps: Vec<Gap>,
    dropped_upto: HashMap<u32, u64>,
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    journals: Mutex<HashMap<u32, Pumped>>,
}

pub struct RingPump {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl RingPump {
    pub fn start() -> std::io::Result<Self> {
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("wp-ring-pump".into())
            .spawn(move || {
                while !s.stop.load(Ordering::Relaxed) {
                    pump_once(&s);
                    std::thread::sleep(PERIOD);
                }
            })?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// Reads `journal` of `pid` from ring index `next` on (the cursor's position; below
    /// `window_from`, the cursor's history).
    pub fn add(&self, pid: u32, journal: Arc<MappedJournal>, next: u64, window_from: u64) {
        let mut j = self
            .shared
            .journals
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        j.entry(pid).or_insert(Pumped {
            journal,
            buf: Buffered {
                next,
                window_from,
                ..Buffered::default()
            },
        });
    }

    pub fn remove(&self, pid: u32) {
        let mut j = self
            .shared
            .journals
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        j.remove(&pid);
    }

    pub fn has(&self, pid: u32) -> bool {
        let j = self
            .shared
            .journals
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        j.contains_key(&pid)
    }

    /// Everything read of `pid`'s ring since the last call, as a `RingRead` a cursor absorbs
    /// (`next` is where the pump continues; `lost` every record that will never come).
    pub fn take(&self, pid: u32) -> Taken {
        let mut j = self
            .shared
            .journals
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        j.get_mut(&pid)
            .map_or_else(Taken::default, |p| drain(&mut p.buf))
    }
}

impl RingPump {
    /// `take`, then what the ring holds past it, read now: the journal's process exited, so
    /// this is all there will be.
    pub fn take_last(&self, pid: u32) -> Taken {
        let mut j = self
            .shared
            .journals
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let Some(p) = j.get_mut(&pid) else {
            return Taken::default();
        };
        let read = p.journal.view().ring_since(p.buf.next, p.buf.window_from);
        append(&mut p.buf, read, usize::MAX, crate::sys::monotonic_ns());
        drain(&mut p.buf)
    }
}

impl Drop for RingPump {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One pass over every journal: the reads happen outside the lock (a ring's worth takes ~1
/// ms), so the engine's `take` never waits for one.
fn pump_once(s: &Shared) {
    let todo: Vec<(u32, Arc<MappedJournal>, u64, u64)> = {
        let j = s.journals.lock().unwrap_or_else(|e| e.into_inner());
        j.iter()
            .map(|(&pid, p)| (pid, p.journal.clone(), p.buf.next, p.buf.window_from))
            .collect()
    };
    for (pid, journal, next, window_from) in todo {
        let read = journal.view().ring_since(next, window_from);
        let mut j = s.journals.lock().unwrap_or_else(|e| e.into_inner());
        let held: usize = j.values().map(|p| p.buf.records.len()).sum();
        let Some(p) = j.get_mut(&pid).map(|p| &mut p.buf) else {
            continue;
        };
        if p.next != next {
            continue; // re-added meanwhile
        }
        append(
            p,
            read,
            CAPACITY.saturating_sub(held),
            crate::sys::monotonic_ns(),
        );
    }
}

/// Everything `b` holds, as a cursor absorbs it (`next`: where the pump goes on).
fn drain(b: &mut Buffered) -> Taken {
    Taken {
        read: RingRead {
            records: std::mem::take(&mut b.records),
            next: b.next,
            lost: std::mem::take(&mut b.lost),
            history_unread: std::mem::take(&mut b.history_unread),
        },
        gaps: std::mem::take(&mut b.gaps),
        dropped_upto: std::mem::take(&mut b.dropped_upto).into_iter().collect(),
    }
}

/// Adds `read` to `p`, keeping at most `room` records; what is not kept is counted and its
/// gap recorded.
fn append(p: &mut Buffered, read: RingRead, room: usize, now_ns: u64) {
    p.next = read.next;
    p.history_unread += read.history_unread;
    let overwritten = read.lost;
    let kept = read.records.len().min(room);
    let buffer_full = (read.records.len() - kept) as u64;
    if overwritten > 0 || buffer_full > 0 {
        let at_ns = read
            .records
            .first()
            .map_or(now_ns, |r| r.start_ns.max(r.end_ns).min(now_ns));
        p.gaps.push(Gap {
            at_ns,
            overwritten,
            buffer_full,
        });
    }
    p.lost += overwritten + buffer_full;
    for r in read.records.iter().skip(kept).filter(|r| r.stream_seq != 0) {
        let e = p.dropped_upto.entry(r.stream_id).or_insert(0);
        *e = (*e).max(r.stream_seq);
    }
    p.records.extend(read.records.into_iter().take(kept));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(start_ns: u64) -> RingRecord {
        RingRecord {
            start_ns,
            ..RingRecord::default()
        }
    }

    #[test]
    fn what_does_not_fit_is_counted_with_where_it_was() {
        let mut p = Buffered::default();
        append(
            &mut p,
            RingRead {
                records: vec![rec(10), rec(11)],
                next: 2,
                lost: 0,
                history_unread: 0,
            },
            10,
            100,
        );
        assert_eq!((p.records.len(), p.lost, p.gaps.len()), (2, 0, 0));
        append(
            &mut p,
            RingRead {
                records: vec![rec(50), rec(51), rec(52)],
                next: 12,
                lost: 7,
                history_unread: 0,
            },
            1,
            100,
        );
        assert_eq!(p.records.len(), 3);
        assert_eq!(p.lost, 7 + 2);
        assert_eq!(
            p.gaps,
            vec![Gap {
                at_ns: 50,
                overwritten: 7,
                buffer_full: 2
            }]
        );
        assert_eq!(p.next, 12);
    }

    #[test]
    fn records_dropped_for_a_full_buffer_say_on_which_streams_up_to_which_number() {
        let mut b = Buffered::default();
        let on = |stream_id, stream_seq| RingRecord {
            stream_id,
            stream_seq,
            ..rec(5)
        };
        let read = RingRead {
            records: vec![on(1, 10), on(1, 11), on(2, 4), on(1, 12), on(3, 0)],
            next: 5,
            lost: 0,
            history_unread: 0,
        };
        append(&mut b, read, 2, 9);
        let mut t = drain(&mut b);
        t.dropped_upto.sort();
        assert_eq!(t.read.records.len(), 2);
        assert_eq!(t.read.lost, 3);
        assert_eq!(
            t.dropped_upto,
            vec![(1, 12), (2, 4)],
            "unnumbered records are not per stream"
        );
    }
}
