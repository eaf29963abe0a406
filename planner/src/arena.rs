//! Static arena layout from liveness.
//!
//! Every tensor that lives in the arena has a lifetime `first..=last` (in steps) and a size in
//! bytes. [`plan_greedy`] assigns offsets so that no two tensors whose lifetimes intersect
//! share a byte: tensors are placed largest first, each at the lowest aligned offset that fits
//! between the already placed tensors it is live with (the greedy-by-size strategy of
//! TFLite's and ExecuTorch's memory planners, `exir/memory_planning.py`). [`plan_naive`] (one
//! slot per tensor, back to back) is the oracle, [`live_lower_bound`] the bound no layout can
//! beat, and [`verify`] the independent overlap check run on every layout.

/// One tensor to place: its lifetime in steps (inclusive) and its size in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetime {
    pub first: usize,
    pub last: usize,
    pub size: u64,
}

/// Byte alignment of every arena offset.
pub const ARENA_ALIGN: u64 = 64;

fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

fn live_together(a: &Lifetime, b: &Lifetime) -> bool {
    a.first <= b.last && b.first <= a.last
}

/// Greedy-by-size placement. Returns one offset per tensor (in input order) and the arena size.
pub fn plan_greedy(tensors: &[Lifetime]) -> (Vec<u64>, u64) {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| {
        tensors[b]
            .size
            .cmp(&tensors[a].size)
            .then(tensors[a].first.cmp(&tensors[b].first))
            .then(a.cmp(&b))
    });
    let mut offsets = vec![0u64; tensors.len()];
    let mut placed: Vec<usize> = Vec::with_capacity(tensors.len());
    let mut total = 0u64;
    for &i in &order {
        let t = &tensors[i];
        // Occupied ranges of tensors live at the same time, sorted by offset.
        let mut busy: Vec<(u64, u64)> = placed
            .iter()
            .filter(|&&j| live_together(&tensors[j], t))
            .map(|&j| (offsets[j], offsets[j] + tensors[j].size))
            .collect();
        busy.sort_unstable();
        // Best fit: the smallest gap that holds the tensor; else the end.
        let mut best: Option<(u64, u64)> = None; // (gap size, offset)
        let mut cursor = 0u64;
        for &(start, end) in &busy {
            let at = align_up(cursor, ARENA_ALIGN);
            if start >= at && start - at >= t.size {
                let gap = start - at;
                if best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, at));
                }
            }
            cursor = cursor.max(end);
        }
        let off = match best {
            Some((_, at)) => at,
            None => align_up(cursor, ARENA_ALIGN),
        };
        offsets[i] = off;
        total = total.max(off + t.size);
        placed.push(i);
    }
    (offsets, align_up(total, ARENA_ALIGN))
}

/// One slot per tensor, back to back: the layout every other must beat.
pub fn plan_naive(tensors: &[Lifetime]) -> (Vec<u64>, u64) {
    let mut off = 0u64;
    let offsets = tensors
        .iter()
        .map(|t| {
            let o = off;
            off = align_up(off + t.size, ARENA_ALIGN);
            o
        })
        .collect();
    (offsets, off)
}

/// The maximum over steps of the bytes live at that step.
pub fn live_lower_bound(tensors: &[Lifetime]) -> u64 {
    let n = tensors.iter().map(|t| t.last + 1).max().unwrap_or(0);
    let mut delta = vec![0i128; n + 1];
    for t in tensors {
        delta[t.first] += i128::from(t.size);
        delta[t.last + 1] -= i128::from(t.size);
    }
    let mut cur = 0i128;
    let mut best = 0i128;
    for d in delta {
        cur += d;
        best = best.max(cur);
    }
    best as u64
}

/// Checks a layout: every tensor inside `size`, aligned, and no two tensors live at the same
/// time overlapping. Returns the first offending pair.
pub fn verify(tensors: &[Lifetime], offsets: &[u64], size: u64) -> Result<(), (usize, usize)> {
    for (i, t) in tensors.iter().enumerate() {
        if !offsets[i].is_multiple_of(ARENA_ALIGN) || offsets[i] + t.size > size {
            return Err((i, i));
        }
    }
    let mut idx: Vec<usize> = (0..tensors.len()).collect();
    idx.sort_by_key(|&i| tensors[i].first);
    let mut active: Vec<usize> = Vec::new();
    for &i in &idx {
        let t = &tensors[i];
        active.retain(|&j| tensors[j].last >= t.first);
        for &j in &active {
            let (a0, a1) = (offsets[i], offsets[i] + t.size);
            let (b0, b1) = (offsets[j], offsets[j] + tensors[j].size);
            if t.size > 0 && tensors[j].size > 0 && a0 < b1 && b0 < a1 {
                return Err((j, i));
            }
        }
        active.push(i);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn lifetimes() -> impl Strategy<Value = Vec<Lifetime>> {
        prop::collection::vec((0usize..40, 0usize..12, 1u64..5000), 1..60).prop_map(|v| {
            v.into_iter()
                .map(|(first, len, size)| Lifetime {
                    first,
                    last: first + len,
                    size,
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn greedy_layouts_never_overlap_and_stay_within_bounds(ts in lifetimes()) {
            let (off, size) = plan_greedy(&ts);
            prop_assert!(verify(&ts, &off, size).is_ok());
            let (_, naive) = plan_naive(&ts);
            prop_assert!(size <= naive, "greedy {} > naive {}", size, naive);
            let sum: u64 = ts.iter().map(|t| align_up(t.size, ARENA_ALIGN)).sum();
            prop_assert!(size <= sum);
            prop_assert!(size >= live_lower_bound(&ts));
        }
    }

    #[test]
    fn verify_catches_overlap() {
        let ts = [
            Lifetime {
                first: 0,
                last: 2,
                size: 100,
            },
            Lifetime {
                first: 1,
                last: 3,
                size: 100,
            },
        ];
        assert_eq!(verify(&ts, &[0, 64], 256), Err((0, 1)));
        assert!(verify(&ts, &[0, 128], 256).is_ok());
    }

    #[test]
    fn disjoint_lifetimes_share_memory() {
        let ts = [
            Lifetime {
                first: 0,
                last: 1,
                size: 1000,
            },
            Lifetime {
                first: 2,
                last: 3,
                size: 1000,
            },
        ];
        let (off, size) = plan_greedy(&ts);
        assert_eq!(off, vec![0, 0]);
        assert_eq!(size, 1024);
    }
}
