//! Stream marks recorded as CUDA events: the cheaper of the two mark primitives, and the
//! default since 2026-12-07 (`WEDGEPROBE_SHIM_MARK_WITH=write` for stream writes; the figures
//! are at `super::DEFAULT_WITH_EVENTS`). From 2026-12-01 they were opt-in: on the H200 a
//! wedge in a burst of launches was named as a kernel that had completed, and after the
//! reader's guard against stale marks it was narrowed to ~1,000 candidates. The cause, found
//! on the H200 on 2026-12-07: the stream's ring was wanted at its first mark, right as the
//! launcher filled the queue behind the stuck kernel, and `cuEventCreate` on the flush thread
//! waited behind that blocked launch until the kernel was released — and the flush thread
//! published nothing meanwhile. Queries do not wait there. So rings are made and given back
//! on a thread of their own (`Marks::make_events`); the flush thread only queries.
//!
//! Why: on the H200 a mark as a stream-ordered write (`cuStreamWriteValue64`) costs the
//! launching thread 0.6–1.8 µs, an event record 0.14 µs (docs/measured-facts.md, 2026-12-01);
//! in eager decode marks were ~1.9% of the step, most of the shim's marks cost. An event says
//! nothing by itself: someone must ask the driver whether it passed. That is the flush
//! thread's poll, every 10 ms: events recorded on one stream complete in the order they were
//! recorded, so the newest one passed is found by a binary search — usually one query (the
//! newest record has passed), ~8 while a stream is busy — and its launch's correlation id
//! becomes the stream's progress (`Writer::mark_progress`), as a passed stream write would.
//! Measured on the H200 (`gpu/event_marks.cu`): during a wedge, with the launching thread
//! waiting for room in a full queue, `cuEventQuery` from another thread answered within 20 µs
//! with the right answers; polling it continuously doubled the launch cost (4.0 → 8–9 µs),
//! hence a sparse poll.
//!
//! Each stream slot gets a ring of `RING` events, created by the event maker's thread the
//! first time a launch wants one (in the stream's context, with its capture mode relaxed, never while a
//! capture is in progress); until then, and whenever the ring is full (the poll fell `RING`
//! marks behind) or a record fails, the mark is a stream write as before — both kinds of
//! progress are lower bounds, and the journal publishes the higher (`Writer::mark_done`).
//!
//! Ownership: records `[retired, head)` are outstanding. Only a marking thread (the stream's
//! launching thread, or the flush thread's idle mark; `busy` keeps them apart) advances
//! `head`, and only into cells outside that range; only the poll advances `retired`. So the
//! cells a poll queries are never re-recorded under it.

use std::{
    ffi::c_void,
    sync::{
        OnceLock,
        atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering::*},
    },
};

use crate::driver::{EventCreate, EventDestroy, EventQuery, EventRecord};

/// Events per stream: room for the marks of 10 ms (one poll) of a stream launching every
/// ~2 µs with a mark every 8 launches (320 in the simulated driver's launch loop), while eager
/// decode on the H200 marks ~100 times in 10 ms. A full ring is not a loss: the mark is a
/// stream write instead.
pub const RING: usize = 512;

/// `CU_EVENT_DISABLE_TIMING` (cuda.h): no timestamp, the cheapest event.
const DISABLE_TIMING: u32 = 0x2;

const NONE: u8 = 0;
const WANTED: u8 = 1;
const READY: u8 = 2;
const FAILED: u8 = 3;
const DESTROYED: u8 = 4;

struct Cells {
    events: Box<[usize]>,
    correlation: Box<[AtomicU64]>,
}

#[derive(Default)]
pub struct Ring {
    state: AtomicU8,
    cells: OnceLock<Cells>,
    head: AtomicU64,
    retired: AtomicU64,
    busy: AtomicBool,
}

/// What `Ring::record` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    Yes,
    /// No events yet (the flush thread is asked to create them).
    NotReady,
    /// `RING` records outstanding: the poll is behind.
    Full,
    /// Another thread is marking this stream right now.
    Busy,
    /// The driver refused the record.
    Failed,
}

impl Ring {
    /// Records the mark of launch `correlation` on `stream` (a marking thread, the stream's
    /// context current).
    pub fn record(&self, record: EventRecord, stream: u64, correlation: u64) -> Recorded {
        let Some(cells) = self.cells.get() else {
            if self.state.load(Relaxed) == NONE {
                self.state.store(WANTED, Relaxed);
            }
            return Recorded::NotReady;
        };
        if self.state.load(Relaxed) == DESTROYED {
            return Recorded::Failed;
        }
        if self.busy.swap(true, Acquire) {
            return Recorded::Busy;
        }
        let seq = self.head.load(Relaxed);
        let out = if seq.wrapping_sub(self.retired.load(Acquire)) >= RING as u64 {
            Recorded::Full
        } else {
            let i = seq as usize % RING;
            // SAFETY: an event of this stream's context, created by `create`, not outstanding
            // (see the module's ownership note); a stream the process uses.
            if unsafe { record(cells.events[i] as *mut c_void, stream as *mut c_void) } != 0 {
                Recorded::Failed
            } else {
                cells.correlation[i].store(correlation, Relaxed);
                self.head.store(seq + 1, Release);
                Recorded::Yes
            }
        };
        self.busy.store(false, Release);
        out
    }

    /// Whether a marking thread asked for events.
    pub fn wanted(&self) -> bool {
        self.state.load(Relaxed) == WANTED
    }

    /// Whether records are outstanding (recorded, not yet seen passed by a poll).
    pub fn outstanding(&self) -> bool {
        self.head.load(Acquire) != self.retired.load(Relaxed)
    }

    /// Whether events were made and not given back.
    pub fn has_events(&self) -> bool {
        self.cells.get().is_some() && self.state.load(Relaxed) != DESTROYED
    }

    /// Flush thread, with the stream's context current and capture mode relaxed: creates the
    /// events. On failure (the driver's error code) the ones made are destroyed and the
    /// stream keeps stream writes.
    pub fn create(&self, create: EventCreate, destroy: EventDestroy) -> Result<(), u32> {
        let mut events = Vec::with_capacity(RING);
        for _ in 0..RING {
            let mut e: *mut c_void = std::ptr::null_mut();
            // SAFETY: an out-pointer and documented flags; a context is current.
            let r = unsafe { create(&mut e, DISABLE_TIMING) };
            if r != 0 || e.is_null() {
                for &e in &events {
                    // SAFETY: events created just above, never recorded.
                    unsafe { destroy(e as *mut c_void) };
                }
                self.state.store(FAILED, Relaxed);
                return Err(r);
            }
            events.push(e as usize);
        }
        let cells = Cells {
            events: events.into_boxed_slice(),
            correlation: (0..RING).map(|_| AtomicU64::new(0)).collect(),
        };
        // Only the flush thread creates, once (the state leaves WANTED here).
        let _ = self.cells.set(cells);
        self.state.store(READY, Relaxed);
        Ok(())
    }

    /// Flush thread, once the stream was destroyed (its context alive): gives its events
    /// back, once.
    pub fn destroy_events(&self, destroy: EventDestroy) {
        if self.state.swap(DESTROYED, Relaxed) == DESTROYED {
            return;
        }
        if let Some(cells) = self.cells.get() {
            for &e in &cells.events {
                // SAFETY: events we created in a context that still exists; their stream is
                // gone, nothing records them again (`DESTROYED`).
                unsafe { destroy(e as *mut c_void) };
            }
        }
    }

    /// Flush thread: the correlation id of the newest outstanding record that has passed, if
    /// any (those before it have passed too), and how many queries it took.
    pub fn poll(&self, query: EventQuery) -> (Option<u64>, u32) {
        let Some(cells) = self.cells.get() else {
            return (None, 0);
        };
        if self.state.load(Relaxed) == DESTROYED {
            return (None, 0);
        }
        let head = self.head.load(Acquire);
        let retired = self.retired.load(Relaxed);
        if head == retired {
            return (None, 0);
        }
        let mut queries = 0;
        let mut passed = |k: u64| {
            queries += 1;
            // SAFETY: an outstanding record's event (not re-recorded while outstanding).
            unsafe { query(cells.events[k as usize % RING] as *mut c_void) == 0 }
        };
        let newest = if passed(head - 1) {
            head - 1
        } else {
            // The first record not passed, in [retired, head - 1].
            let (mut lo, mut hi) = (retired, head - 1);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if passed(mid) {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            if lo == retired {
                return (None, queries);
            }
            lo - 1
        };
        let c = cells.correlation[newest as usize % RING].load(Relaxed);
        self.retired.store(newest + 1, Release);
        (Some(c), queries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64 as Counter;

    // A fake driver: events are indices into EVENTS; a record stamps the event with the
    // stream's next sequence number; an event has passed once the "GPU" has run that far.
    static NEXT: Counter = Counter::new(1);
    static GPU_DONE: Counter = Counter::new(0);
    static STAMP: [Counter; RING] = [const { Counter::new(0) }; RING];
    static QUERIES: Counter = Counter::new(0);
    /// `CUDA_ERROR_NOT_READY`.
    const NOT_READY: u32 = 600;

    unsafe extern "C" fn create(e: *mut *mut c_void, _flags: u32) -> u32 {
        static N: Counter = Counter::new(1);
        // SAFETY: the test passes a valid out-pointer.
        unsafe { *e = N.fetch_add(1, Relaxed) as *mut c_void };
        0
    }
    unsafe extern "C" fn destroy(_e: *mut c_void) -> u32 {
        0
    }
    unsafe extern "C" fn record(e: *mut c_void, _s: *mut c_void) -> u32 {
        STAMP[(e as usize - 1) % RING].store(NEXT.fetch_add(1, Relaxed), Relaxed);
        0
    }
    unsafe extern "C" fn query(e: *mut c_void) -> u32 {
        QUERIES.fetch_add(1, Relaxed);
        if STAMP[(e as usize - 1) % RING].load(Relaxed) <= GPU_DONE.load(Relaxed) {
            0
        } else {
            NOT_READY
        }
    }

    #[test]
    fn the_poll_finds_the_newest_passed_mark_and_the_ring_never_overruns_it() {
        let r = Ring::default();
        assert_eq!(r.record(record, 1, 10), Recorded::NotReady);
        assert!(r.wanted());
        assert!(r.create(create, destroy).is_ok());
        assert!(!r.wanted(), "created once");
        assert_eq!(r.poll(query), (None, 0), "nothing outstanding");
        // Marks of launches 100, 200, …: the n-th record gets stamp n.
        for n in 1..=RING as u64 {
            assert_eq!(r.record(record, 1, n * 100), Recorded::Yes);
        }
        assert_eq!(
            r.record(record, 1, 99_999),
            Recorded::Full,
            "a cell re-recorded unpolled"
        );
        // Nothing passed yet: the binary search says so.
        let (c, q) = r.poll(query);
        assert_eq!(c, None);
        assert!(q <= 11, "{q} queries");
        // The GPU passed 37 records: the 37th launch's id.
        GPU_DONE.store(37, Relaxed);
        let (c, q) = r.poll(query);
        assert_eq!(c, Some(3_700));
        assert!(q <= 11, "{q} queries");
        // Room for 37 more now, not 38.
        for n in 0..37 {
            assert_eq!(r.record(record, 1, 20_000 + n), Recorded::Yes);
        }
        assert_eq!(r.record(record, 1, 99_999), Recorded::Full);
        // Everything passed: one query (the newest).
        GPU_DONE.store(u64::MAX, Relaxed);
        assert_eq!(r.poll(query), (Some(20_036), 1));
        assert_eq!(r.poll(query), (None, 0));
    }
}
