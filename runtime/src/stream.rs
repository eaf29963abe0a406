//! Weight streaming for segmented execution under a memory budget.
//!
//! Before a segment runs, the sections holding its weights are made resident and the next
//! segment's sections are prefetched (`madvise(WILLNEED)`: the kernel reads them ahead while
//! this segment computes). When the weights resident in this process plus the arena would
//! exceed the budget, the least recently used sections that neither this nor the next segment
//! needs are released (`madvise(DONTNEED)` on the read-only file mapping: the pages are
//! dropped and re-read from the file on their next use). A section is only released between
//! segments, when no kernel holds a view into it (DESIGN.md invariant 9).
//!
//! Without a budget nothing is ever released and every section stays resident after its first
//! use, which is the monolithic behaviour.

use edge_schema::plan::{PlanMeta, Storage};

use crate::plan::Plan;

/// Streaming state of one session.
#[derive(Debug)]
pub struct Streamer {
    budget: Option<u64>,
    arena: u64,
    /// `[stage][segment]` → sections its steps read weights from.
    needs: Vec<Vec<Vec<u32>>>,
    section_len: Vec<u64>,
    state: State,
}

#[derive(Debug)]
struct State {
    resident: Vec<bool>,
    last_use: Vec<u64>,
    tick: u64,
    resident_bytes: u64,
    streamed_bytes: u64,
    released_bytes: u64,
}

impl Streamer {
    /// Prepares streaming for `meta` with an optional weight + arena `budget` (bytes) and the
    /// session's `arena` size.
    pub fn new(meta: &PlanMeta, budget: Option<u64>, arena: u64) -> Streamer {
        let needs = meta
            .stages
            .iter()
            .map(|st| {
                st.segments
                    .iter()
                    .map(|seg| {
                        let mut secs: Vec<u32> = Vec::new();
                        let steps = st
                            .steps
                            .get(seg.first_step as usize..seg.end_step as usize)
                            .unwrap_or(&[]);
                        for step in steps {
                            for &i in &step.inputs {
                                if let Some(Storage::Weight(t)) =
                                    st.values.get(i as usize).map(|v| &v.storage)
                                {
                                    if let Some(e) = meta.tensors.get(*t as usize) {
                                        if !secs.contains(&e.section) {
                                            secs.push(e.section);
                                        }
                                    }
                                }
                            }
                        }
                        secs
                    })
                    .collect()
            })
            .collect();
        let n = meta.sections.len();
        Streamer {
            budget,
            arena,
            needs,
            section_len: meta.sections.iter().map(|s| s.len).collect(),
            state: State {
                resident: vec![false; n],
                last_use: vec![0; n],
                tick: 0,
                resident_bytes: 0,
                streamed_bytes: 0,
                released_bytes: 0,
            },
        }
    }

    /// Called before segment `seg` of stage `stage` runs; `next` is the segment expected to
    /// run after it (same stage), if any. Allocates nothing.
    pub fn before_segment(&mut self, plan: &Plan, stage: usize, seg: usize, next: Option<usize>) {
        let lookup = |stage: usize, seg: usize| -> &[u32] {
            self.needs
                .get(stage)
                .and_then(|s| s.get(seg))
                .map(|v| v.as_slice())
                .unwrap_or(&[])
        };
        let now = lookup(stage, seg);
        let upcoming = next.map(|n| lookup(stage, n)).unwrap_or(&[]);
        let st = &mut self.state;
        st.tick += 1;
        for &s in now {
            let s = s as usize;
            st.last_use[s] = st.tick;
            if !st.resident[s] {
                st.resident[s] = true;
                st.resident_bytes += self.section_len[s];
                st.streamed_bytes += self.section_len[s];
            }
        }
        if let Some(budget) = self.budget {
            let prefetch: u64 = upcoming
                .iter()
                .filter(|&&s| !st.resident[s as usize])
                .map(|&s| self.section_len[s as usize])
                .sum();
            while self.arena + st.resident_bytes + prefetch > budget {
                let victim = (0..st.resident.len())
                    .filter(|&s| {
                        st.resident[s]
                            && !now.contains(&(s as u32))
                            && !upcoming.contains(&(s as u32))
                    })
                    .min_by_key(|&s| st.last_use[s]);
                let Some(v) = victim else { break };
                plan.release_section(v);
                st.resident[v] = false;
                st.resident_bytes -= self.section_len[v];
                st.released_bytes += self.section_len[v];
            }
        }
        for &s in upcoming {
            if !st.resident[s as usize] {
                plan.prefetch_section(s as usize);
            }
        }
    }

    /// Bytes of weight sections made resident that were not resident before (first loads and
    /// re-reads after a release), since the session started.
    pub fn streamed_bytes(&self) -> u64 {
        self.state.streamed_bytes
    }

    /// Bytes released since the session started.
    pub fn released_bytes(&self) -> u64 {
        self.state.released_bytes
    }
}
