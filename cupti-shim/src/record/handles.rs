//! Per-thread caches of what a driver handle resolves to (a launched function's name id, a
//! stream's id, an executable graph's id), so that a launch does not ask the driver or hash a
//! name again.
//!
//! Why not a plain direct-mapped table indexed by the handle's low bits (what this replaced):
//! on the H200 the shim cost 1.1–2.5 µs per launch in the serving model's eager decode against
//! ~0.5 µs in a one-kernel C loop (`WEDGEPROBE_SHIM_MEASURE=self_cost`, BENCHMARKS.md, the
//! recorder's price, 2026-12-01). A decode step launches some tens of distinct kernels; handles are heap objects with a
//! common stride, so `(handle >> 4) % 64` put many of them in the same entry and each launch
//! evicted the next one's name — a driver call and a hash of a 200–300-byte mangled name every
//! time. Here: the whole handle is hashed (Fibonacci hashing), and each set holds two entries,
//! the latest hit first.

use std::cell::Cell;

/// (handle, tag, value); value 0 = nothing cached.
type Entry = Cell<(usize, u64, u64)>;

pub struct HandleCache<const SETS: usize> {
    sets: [[Entry; 2]; SETS],
}

impl<const SETS: usize> HandleCache<SETS> {
    /// `SETS` must be a power of two.
    pub const fn new() -> Self {
        Self {
            sets: [const { [const { Cell::new((0, 0, 0)) }; 2] }; SETS],
        }
    }

    fn set_of(key: usize) -> usize {
        let bits = SETS.trailing_zeros();
        if bits == 0 {
            return 0;
        }
        ((key as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - bits)) as usize
    }

    /// The value cached for (`key`, `tag`), or `make`'s (cached unless 0). `tag` tells a reused
    /// handle apart (an epoch, a check of the name).
    pub fn get_or(&self, key: usize, tag: u64, make: impl FnOnce() -> u64) -> u64 {
        let set = &self.sets[Self::set_of(key) % SETS];
        let first = set[0].get();
        if first.0 == key && first.1 == tag && first.2 != 0 {
            return first.2;
        }
        let second = set[1].get();
        if second.0 == key && second.1 == tag && second.2 != 0 {
            set[1].set(first);
            set[0].set(second);
            return second.2;
        }
        let v = make();
        if v != 0 {
            set[1].set(first);
            set[0].set((key, tag, v));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_with_a_common_stride_stay_cached_together() {
        let cache = HandleCache::<256>::new();
        // 48 kernels' handles 1 KiB apart, launched round-robin many times.
        let handles: Vec<usize> = (0..48).map(|i| 0x5555_0000_0000 + i * 1024).collect();
        let mut made = 0;
        for _ in 0..100 {
            for (i, &h) in handles.iter().enumerate() {
                let v = cache.get_or(h, 1, || {
                    made += 1;
                    i as u64 + 1
                });
                assert_eq!(v, i as u64 + 1);
            }
        }
        assert!(made <= 48 + 48, "{made} driver lookups for 48 handles");
    }

    #[test]
    fn a_new_tag_misses() {
        let cache = HandleCache::<4>::new();
        assert_eq!(cache.get_or(0x1000, 1, || 7), 7);
        assert_eq!(cache.get_or(0x1000, 1, || 9), 7);
        assert_eq!(cache.get_or(0x1000, 2, || 9), 9);
        assert_eq!(cache.get_or(0x2000, 2, || 0), 0);
        assert_eq!(cache.get_or(0x2000, 2, || 5), 5, "0 is never cached");
    }
}
