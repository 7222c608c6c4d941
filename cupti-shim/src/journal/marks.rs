//! The journal's stream marks: per stream, the correlation id through which its kernels have
//! completed, as the stream itself reports it (see `crate::marks` for when marks are
//! enqueued). A stream write mark's progress word is written by the GPU in pinned process
//! memory; an event mark's progress is found by the flush thread's poll (`crate::marks::events`)
//! and noted in `done_seen`. The flush thread copies the higher of the two into the stream's
//! `MarkSlot` with the time it first saw the value, and launches read them directly to reuse
//! in-flight slots of retired launches.
//!
//! Slots are claimed once per stream (first launch on it, in both record modes), off the
//! per-launch path. Each also counts the ring records written for its stream
//! (`MarkSlot::records`), so a reader that misses records can say on which streams.

use core::{
    mem::{offset_of, size_of},
    sync::atomic::{AtomicU64, Ordering::*},
};

use probe_common::journal::{MarkSlot, drops};

use super::{MAX_PROBE, Writer};

const KEY: u64 = offset_of!(MarkSlot, key) as u64;
const DEVICE: u64 = offset_of!(MarkSlot, device) as u64;
const STREAM: u64 = offset_of!(MarkSlot, stream) as u64;
const DONE: u64 = offset_of!(MarkSlot, done) as u64;
const DONE_AT: u64 = offset_of!(MarkSlot, done_at_ns) as u64;
const RECORDS: u64 = offset_of!(MarkSlot, records) as u64;

impl Writer {
    fn mark_off(&self, i: u32) -> u64 {
        self.layout.marks_off() + i as u64 * size_of::<MarkSlot>() as u64
    }

    pub fn marks_cap(&self) -> u32 {
        self.layout.marks_cap
    }

    /// The mark slot of stream `key` (CUPTI stream id + 1, never 0), claimed on first use;
    /// `None` (counted) when the table is full around its home.
    pub fn mark_slot(&self, key: u32, device: u32, stream: u64) -> Option<u32> {
        let cap = self.layout.marks_cap;
        let home = self.home(key as u64, cap);
        for k in 0..cap.min(MAX_PROBE) {
            let i = super::wrap(u64::from(home + k), cap);
            let off = self.mark_off(i);
            // Every launch looks its stream up: a plain load in the common case, not a CAS
            // that would take the cache line from other launching threads.
            match self.half(off + KEY).load(Acquire) {
                k if k == key => return Some(i),
                0 => {}
                _ => continue,
            }
            match self
                .half(off + KEY)
                .compare_exchange(0, key, AcqRel, Acquire)
            {
                Ok(_) => {
                    self.half(off + DEVICE).store(device, Relaxed);
                    self.word(off + STREAM).store(stream, Release);
                    self.marks_claimed.set(i);
                    return Some(i);
                }
                Err(k) if k == key => return Some(i),
                Err(_) => {}
            }
        }
        self.count_drop(drops::MARKS_FULL);
        None
    }

    /// The slot of stream `key` if it was claimed (no claim: a completion on a stream no
    /// launch named has nothing to number its records against).
    pub fn find_mark_slot(&self, key: u32) -> Option<u32> {
        let cap = self.layout.marks_cap;
        let home = self.home(key as u64, cap);
        for k in 0..cap.min(MAX_PROBE) {
            let i = super::wrap(u64::from(home + k), cap);
            match self.half(self.mark_off(i) + KEY).load(Acquire) {
                k if k == key => return Some(i),
                0 => return None,
                _ => {}
            }
        }
        None
    }

    /// Stream slot `i`'s record counter (`None`: no such slot).
    pub(super) fn stream_records(&self, i: u32) -> Option<&AtomicU64> {
        (i < self.layout.marks_cap).then(|| self.word(self.mark_off(i) + RECORDS))
    }

    /// Hands the writer the progress words (`marks_cap` of them) the GPU writes.
    ///
    /// # Safety
    /// `words` must point to `marks_cap` u64s, 8-aligned, that stay mapped for the process's
    /// life and are only ever accessed atomically from the CPU.
    pub unsafe fn set_mark_words(&self, words: *mut u64) {
        self.marks_done.store(words.cast(), Release);
    }

    /// Stream `i`'s progress: the higher of its pinned word and what event polls found (0
    /// before any mark passed).
    pub fn mark_done(&self, i: u32) -> u64 {
        let Some(seen) = self.done_seen.get(i as usize) else {
            return 0;
        };
        let seen = seen.load(Acquire);
        let p = self.marks_done.load(Acquire);
        if p.is_null() {
            return seen;
        }
        // SAFETY: `set_mark_words` contract: `marks_cap` atomics; `i` < marks_cap (checked
        // by the `done_seen` lookup, which has marks_cap entries).
        seen.max(unsafe { &*p.add(i as usize) }.load(Acquire))
    }

    /// An event poll found stream `i`'s kernels complete through `correlation`.
    pub fn mark_progress(&self, i: u32, correlation: u64) {
        if let Some(seen) = self.done_seen.get(i as usize) {
            seen.fetch_max(correlation, Release);
        }
    }

    /// The claimed mark slots, in index order.
    pub fn claimed_marks(&self) -> impl Iterator<Item = u32> + '_ {
        self.marks_claimed.iter()
    }

    /// Copies every claimed stream's progress into its journal slot, noting when a value was
    /// first seen (flush thread, every tick).
    pub fn publish_marks(&self, now_ns: u64) {
        for i in self.claimed_marks() {
            let off = self.mark_off(i);
            let done = self.mark_done(i);
            let slot: &AtomicU64 = self.word(off + DONE);
            if slot.load(Relaxed) != done {
                self.word(off + DONE_AT).store(now_ns, Relaxed);
                slot.store(done, Release);
            }
        }
    }
}
