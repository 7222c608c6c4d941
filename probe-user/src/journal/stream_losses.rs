//! Which streams' records a reader missed, and how many.
//!
//! The ring says exactly how many records were lost (overwritten before they were read, or
//! dropped by a full reader buffer) but not whose: a lost record's stream is gone with it. A
//! trace with holes on one stream looks like that stream idled, so the loss has to be
//! counted per stream. The shim numbers every launch and completion record on its stream
//! (`RingRecord::stream_seq`, from the stream slot's `records` counter, taken before the ring
//! index), so per stream the numbers a reader never saw are its losses:
//!
//! - numbers at or below the stream's count when the reader started (`starting_at`) were
//!   written before it: history, neither read nor lost;
//! - between that and the highest number read, every number not read is lost — exact, up
//!   to records two threads on one stream numbered in one order and put on the ring in the
//!   other, which count as lost only until the second one is read;
//! - after the highest number read: not lost yet (not read yet), unless the stream's process
//!   has exited (`settle`), when its final count closes the window.
//!
//! A deliberate skip (the daemon's bounded reads, `JournalCursor::advance_at_most`) is not a
//! loss: each stream starts counting again from its first number read after it.

use std::collections::HashMap;

use probe_common::journal::RingRecord;

pub use crate::model::StreamLoss;

#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    device: u32,
    /// Numbers up to this were written before the window (not read, not lost).
    from: u64,
    /// Records of the window read.
    read: u64,
    /// Highest number read (or the final count, settled).
    highest: u64,
    /// Losses counted, and records read, before a skip restarted the window.
    lost_before: u64,
    read_before: u64,
    /// A skip passed over records: the next number read starts a new window.
    resync: bool,
}

impl Tally {
    fn lost(&self) -> u64 {
        self.lost_before
            + self
                .highest
                .saturating_sub(self.from)
                .saturating_sub(self.read)
    }
}

#[derive(Clone, Debug, Default)]
pub struct StreamLosses {
    by_stream: HashMap<u32, Tally>,
}

impl StreamLosses {
    /// A window that begins after the streams' records so far (`counts`: the journal's
    /// per-stream counts, read after the ring head the reader starts from).
    pub fn after(counts: &[(u32, u64)]) -> Self {
        Self {
            by_stream: counts
                .iter()
                .map(|&(id, n)| {
                    (
                        id,
                        Tally {
                            from: n,
                            highest: n,
                            ..Tally::default()
                        },
                    )
                })
                .collect(),
        }
    }

    pub fn note(&mut self, r: &RingRecord) {
        self.note_all(std::slice::from_ref(r));
    }

    /// `note` for each record, the stream's tally looked up once per run of records of one
    /// stream (a launch-bound process's ring is long runs of one stream: a lookup per record
    /// was a tenth of the daemon's reading).
    pub fn note_all(&mut self, records: &[RingRecord]) {
        for run in records.chunk_by(|a, b| a.stream_id == b.stream_id) {
            let mut counted = run.iter().filter(|r| r.stream_seq != 0).peekable();
            let Some(first) = counted.peek() else {
                continue;
            };
            let t = self.by_stream.entry(first.stream_id).or_default();
            for r in counted {
                Self::note_in(t, r);
            }
        }
    }

    fn note_in(t: &mut Tally, r: &RingRecord) {
        t.device = r.device;
        if t.resync {
            *t = Tally {
                device: r.device,
                from: r.stream_seq - 1,
                highest: r.stream_seq - 1,
                lost_before: t.lost(),
                read_before: t.read_before + t.read,
                ..Tally::default()
            };
        }
        if r.stream_seq <= t.from {
            return;
        }
        t.read += 1;
        t.highest = t.highest.max(r.stream_seq);
    }

    /// Records a reader saw but could not keep (its buffer full): lost, on their streams,
    /// up to these numbers.
    pub fn dropped_upto(&mut self, upto: &[(u32, u64)]) {
        for &(id, n) in upto {
            let t = self.by_stream.entry(id).or_default();
            if !t.resync && n > t.from {
                t.highest = t.highest.max(n);
            }
        }
    }

    /// Records were skipped on purpose: nothing after what was read so far is a loss until
    /// each stream's next record read.
    pub fn skipped(&mut self) {
        for t in self.by_stream.values_mut() {
            t.resync = true;
        }
    }

    /// The process exited: its streams' final counts close the window.
    pub fn settle(&mut self, counts: &[(u32, u64)]) {
        for &(id, n) in counts {
            let t = self.by_stream.entry(id).or_default();
            if !t.resync {
                t.highest = t.highest.max(n);
            }
        }
    }

    /// Streams with records in the window, most lost first.
    pub fn streams(&self) -> Vec<StreamLoss> {
        let mut out: Vec<StreamLoss> = self
            .by_stream
            .iter()
            .map(|(&stream_id, t)| StreamLoss {
                stream_id,
                device: t.device,
                written: t.read_before + t.read + t.lost(),
                lost: t.lost(),
            })
            .filter(|s| s.written > 0)
            .collect();
        out.sort_by(|a, b| b.lost.cmp(&a.lost).then(a.stream_id.cmp(&b.stream_id)));
        out
    }

    /// Streams that lost records, most first.
    pub fn lossy(&self) -> Vec<StreamLoss> {
        self.streams().into_iter().filter(|s| s.lost > 0).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(stream_id: u32, seq: u64) -> RingRecord {
        RingRecord {
            stream_id,
            stream_seq: seq,
            ..RingRecord::default()
        }
    }

    #[test]
    fn numbers_never_read_between_ones_read_are_lost_on_their_stream() {
        let mut l = StreamLosses::after(&[(7, 100)]);
        for s in [99, 100, 101, 102, 110, 111] {
            l.note(&rec(7, s)); // 99, 100: history
        }
        for s in 1..=5 {
            l.note(&rec(9, s)); // a stream made after the start
        }
        l.note(&rec(9, 0)); // not numbered: not counted
        assert_eq!(
            l.streams(),
            vec![
                StreamLoss {
                    stream_id: 7,
                    device: 0,
                    written: 11,
                    lost: 7
                },
                StreamLoss {
                    stream_id: 9,
                    device: 0,
                    written: 5,
                    lost: 0
                },
            ]
        );
    }

    #[test]
    fn a_record_read_late_is_not_lost_once_read() {
        let mut l = StreamLosses::after(&[]);
        l.note(&rec(1, 2));
        assert_eq!(l.lossy()[0].lost, 1);
        l.note(&rec(1, 1));
        assert!(l.lossy().is_empty());
    }

    #[test]
    fn the_tail_counts_only_once_the_process_exited() {
        let mut l = StreamLosses::after(&[(3, 10)]);
        l.note(&rec(3, 11));
        assert!(l.lossy().is_empty(), "12.. may still be on the ring");
        l.settle(&[(3, 20)]);
        assert_eq!(l.lossy()[0].lost, 9);
        assert_eq!(l.lossy()[0].written, 10);
    }

    #[test]
    fn a_skip_is_not_a_loss() {
        let mut l = StreamLosses::after(&[(3, 0)]);
        l.note(&rec(3, 1));
        l.note(&rec(3, 3)); // 2 lost
        l.skipped();
        l.note(&rec(3, 500));
        l.note(&rec(3, 502)); // 501 lost
        let s = l.streams();
        assert_eq!((s[0].lost, s[0].written), (2, 6));
    }
}
