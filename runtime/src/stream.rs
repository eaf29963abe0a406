//! Weight streaming for segmented execution under a memory budget.
//!
//! Before a segment runs, the sections holding its weights are made resident and the next
//! segment's sections are prefetched (`madvise(WILLNEED)`: the kernel reads them ahead while
//! this segment computes). When the weights resident in this process plus the arena would
//! exceed the budget, sections that neither this nor the next segment needs are released
//! (`madvise(DONTNEED)` on the read-only file mapping: the pages are dropped and re-read from
//! the file on their next use). A section is only released between segments, when no kernel
//! holds a view into it (DESIGN.md invariant 9).
//!
//! Which sections go: first those the running stage does not use (least recently used
//! first: the text encoder's once the denoiser runs), then the stage's own section whose next
//! use is farthest ahead, counting segments cyclically because the sampler runs the denoiser
//! stage over and over. This is Belady's optimal replacement for that access pattern (for a
//! cycle it evicts the most recently used section): a denoiser that does not fit keeps as many
//! sections resident as the budget allows and re-reads only the rest each run, where
//! least-recently-used eviction would re-read every section every run.
//!
//! Without a budget nothing is ever released and every section stays resident after its first
//! use, which is the monolithic behaviour.

use edge_schema::plan::PlanMeta;

use crate::plan::Plan;

/// What the streamer asks of the weight mapping (implemented by [`Plan`]).
pub trait Pager {
    /// Drops section `s`'s pages from this process (they are re-read on next use).
    fn release_section(&self, s: usize);
    /// Starts reading section `s` ahead of its use.
    fn prefetch_section(&self, s: usize);
    /// Maps section `s` into this process now, before a segment reads all of it (one system
    /// call instead of a page fault per few pages). Default: nothing (the pages fault in).
    fn populate_section(&self, s: usize) {
        let _ = s;
    }
}

impl Pager for Plan {
    fn release_section(&self, s: usize) {
        Plan::release_section(self, s);
    }
    fn prefetch_section(&self, s: usize) {
        Plan::prefetch_section(self, s);
    }
    fn populate_section(&self, s: usize) {
        Plan::populate_section(self, s);
    }
}

/// Streaming state of one session.
#[derive(Debug)]
pub struct Streamer {
    budget: Option<u64>,
    /// Per stage: its arena bytes (the pages resident while it runs).
    arena: Vec<u64>,
    /// `[stage][segment]` → sections its steps read weights from.
    needs: Vec<Vec<Vec<u32>>>,
    /// Per section: its charge (bytes it makes resident).
    section_len: Vec<u64>,
    /// Per section: read only in part (gathered embedding rows), so never prefetched whole.
    gathered: Vec<bool>,
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
    /// Prepares streaming for `meta` with an optional weight + arena `budget` (bytes). Each
    /// stage is charged its own arena (the session releases the pages above it), each section
    /// the pages its tensors make resident ([`edge_schema::memory::section_charges`]: an
    /// embedding table only its gathered rows).
    pub fn new(meta: &PlanMeta, budget: Option<u64>) -> Streamer {
        let needs = meta
            .stages
            .iter()
            .map(|st| {
                st.segments
                    .iter()
                    .map(|seg| {
                        let mut secs: Vec<u32> = Vec::new();
                        let ts = edge_schema::memory::tensors_of(
                            st,
                            seg.first_step as usize,
                            seg.end_step as usize,
                        );
                        for e in ts.iter().filter_map(|&t| meta.tensors.get(t as usize)) {
                            if !secs.contains(&e.section) {
                                secs.push(e.section);
                            }
                        }
                        secs
                    })
                    .collect()
            })
            .collect();
        let mut st =
            Streamer::from_needs(needs, edge_schema::memory::section_charges(meta), budget, 0);
        st.arena = meta.stages.iter().map(|s| s.arena_size).collect();
        st.gathered = meta
            .sections
            .iter()
            .zip(&st.section_len)
            .map(|(s, &charge)| charge < s.len)
            .collect();
        st
    }

    /// A streamer over `section_len.len()` sections, `needs[stage][segment]` listing the
    /// sections each segment reads.
    fn from_needs(
        needs: Vec<Vec<Vec<u32>>>,
        section_len: Vec<u64>,
        budget: Option<u64>,
        arena: u64,
    ) -> Streamer {
        let n = section_len.len();
        Streamer {
            budget,
            arena: vec![arena; needs.len()],
            gathered: vec![false; n],
            needs,
            section_len,
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
    pub fn before_segment(
        &mut self,
        pager: &impl Pager,
        stage: usize,
        seg: usize,
        next: Option<usize>,
    ) {
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
                // The segment reads a whole section (a gathered one only in rows).
                if !self.gathered[s] {
                    pager.populate_section(s);
                }
            }
        }
        if let Some(budget) = self.budget {
            let prefetch: u64 = upcoming
                .iter()
                .filter(|&&s| !st.resident[s as usize])
                .map(|&s| self.section_len[s as usize])
                .sum();
            let segments = self.needs.get(stage).map(Vec::as_slice).unwrap_or(&[]);
            // Segments until `s` is needed again by this stage (cyclically), if ever.
            let next_use = |s: u32| {
                (1..=segments.len())
                    .find(|d| segments[(seg + d) % segments.len()].contains(&s))
                    .map(|d| d as u64)
            };
            let arena = self.arena.get(stage).copied().unwrap_or(0);
            while arena + st.resident_bytes + prefetch > budget {
                let victim = (0..st.resident.len())
                    .filter(|&s| {
                        st.resident[s]
                            && !now.contains(&(s as u32))
                            && !upcoming.contains(&(s as u32))
                    })
                    .max_by_key(|&s| match next_use(s as u32) {
                        None => (1, u64::MAX - st.last_use[s]),
                        Some(d) => (0, d),
                    });
                let Some(v) = victim else { break };
                pager.release_section(v);
                st.resident[v] = false;
                st.resident_bytes -= self.section_len[v];
                st.released_bytes += self.section_len[v];
            }
        }
        for &s in upcoming {
            if !st.resident[s as usize] && !self.gathered[s as usize] {
                pager.prefetch_section(s as usize);
            }
        }
    }

    /// Whether section `s` is read in part only (gathered embedding rows): never made resident
    /// whole, so hashed through the file rather than the mapping.
    pub fn is_gathered(&self, s: usize) -> bool {
        self.gathered.get(s).copied().unwrap_or(true)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Records nothing: the bookkeeping is what is tested.
    struct NoPager;

    impl Pager for NoPager {
        fn release_section(&self, _: usize) {}
        fn prefetch_section(&self, _: usize) {}
    }

    /// A denoiser-like stage of 8 segments (one 100-byte section each) run 12 times under a
    /// budget of 5 sections (one of which holds the prefetched next section): the budget is
    /// never exceeded, and after the first run 4 sections on average are re-read per run
    /// (Belady's bound for a cycle of 8 through 5 slots is 8 − 5 + 1; it alternates 3, 4, 5
    /// here); least-recently-used eviction would re-read all 8 every run.
    #[test]
    fn cyclic_stage_keeps_what_fits_resident() {
        let needs = vec![(0..8u32).map(|s| vec![s]).collect::<Vec<_>>()];
        let mut st = Streamer::from_needs(needs, vec![100; 8], Some(500), 0);
        let mut per_run = Vec::new();
        for _ in 0..12 {
            let before = st.streamed_bytes();
            for seg in 0..8 {
                let next = (seg + 1 < 8).then_some(seg + 1);
                st.before_segment(&NoPager, 0, seg, next);
                assert!(
                    st.state.resident_bytes <= 500,
                    "{}",
                    st.state.resident_bytes
                );
            }
            per_run.push(st.streamed_bytes() - before);
        }
        assert_eq!(per_run[0], 800);
        let steady: u64 = per_run[1..].iter().sum();
        assert!(
            steady <= 400 * 11 && per_run[1..].iter().all(|&b| b <= 500),
            "bytes re-read per run: {per_run:?}"
        );
    }

    /// Sections of a stage that has finished (the text encoder's) go before the running
    /// stage's own.
    #[test]
    fn other_stages_sections_go_first() {
        let needs = vec![vec![vec![0], vec![1]], vec![vec![2], vec![3], vec![4]]];
        let mut st = Streamer::from_needs(needs, vec![100; 5], Some(300), 0);
        st.before_segment(&NoPager, 0, 0, Some(1));
        st.before_segment(&NoPager, 0, 1, None);
        st.before_segment(&NoPager, 1, 0, Some(1));
        st.before_segment(&NoPager, 1, 1, Some(2));
        assert_eq!(st.state.resident[..2], [false, false]);
        assert!(st.state.resident[2] && st.state.resident[3]);
    }

    /// Records every release and prefetch, and keeps its own account of what is resident
    /// (a section becomes resident when a segment that reads it runs, and stops being
    /// resident when released).
    #[derive(Default)]
    struct RecordingPager {
        released: std::cell::RefCell<Vec<usize>>,
        prefetched: std::cell::RefCell<Vec<usize>>,
    }

    impl Pager for RecordingPager {
        fn release_section(&self, s: usize) {
            self.released.borrow_mut().push(s);
        }
        fn prefetch_section(&self, s: usize) {
            self.prefetched.borrow_mut().push(s);
        }
    }

    /// Seen through the pager (what the process really does to its mapping): a release never
    /// hits a section of the running segment or of the next one, the pages the pager holds
    /// plus the arena stay within the budget, the next segment's missing sections are
    /// prefetched, and sections are released only when the budget requires it. Segments share
    /// sections and sections differ in size, so "current" and "next" overlap.
    #[test]
    fn releases_never_touch_the_running_or_next_segment() {
        let needs = vec![
            vec![vec![0], vec![1]],
            vec![
                vec![2, 3],
                vec![3, 4],
                vec![4, 5, 2],
                vec![6],
                vec![6, 7],
                vec![2, 7],
            ],
        ];
        let len = vec![300, 50, 120, 80, 60, 140, 200, 90];
        for budget in [430u64, 500, 700] {
            let arena = 40;
            let pager = RecordingPager::default();
            let mut st = Streamer::from_needs(needs.clone(), len.clone(), Some(budget), arena);
            let mut resident = vec![false; len.len()];
            let mut order: Vec<(usize, usize)> = vec![(0, 0), (0, 1)];
            for _ in 0..5 {
                order.extend((0..6).map(|g| (1, g)));
            }
            for (k, &(stage, seg)) in order.iter().enumerate() {
                let next = order
                    .get(k + 1)
                    .filter(|&&(s, _)| s == stage)
                    .map(|&(_, g)| g);
                pager.released.borrow_mut().clear();
                pager.prefetched.borrow_mut().clear();
                st.before_segment(&pager, stage, seg, next);
                let now = &needs[stage][seg];
                let upcoming: &[u32] = next.map_or(&[], |n| &needs[stage][n]);
                for &r in pager.released.borrow().iter() {
                    assert!(
                        !now.contains(&(r as u32)) && !upcoming.contains(&(r as u32)),
                        "budget {budget}, stage {stage} segment {seg}: released section {r} of the current or next segment"
                    );
                    assert!(resident[r], "released section {r}, which was not resident");
                    resident[r] = false;
                }
                for &s in now {
                    resident[s as usize] = true;
                }
                let held: u64 = (0..len.len())
                    .filter(|&s| resident[s])
                    .map(|s| len[s])
                    .sum();
                let fetching: u64 = upcoming
                    .iter()
                    .filter(|&&s| !resident[s as usize])
                    .map(|&s| len[s as usize])
                    .sum();
                let floor: u64 = now.iter().chain(upcoming).map(|&s| len[s as usize]).sum();
                if arena + floor <= budget {
                    assert!(
                        arena + held + fetching <= budget,
                        "budget {budget}, stage {stage} segment {seg}: {held} resident + {fetching} prefetched + {arena} arena"
                    );
                }
                for &s in upcoming {
                    assert_eq!(
                        pager.prefetched.borrow().contains(&(s as usize)),
                        !resident[s as usize],
                        "section {s} of the next segment: prefetched iff not resident"
                    );
                }
                // Nothing is released while there was room without releasing.
                if !pager.released.borrow().is_empty() {
                    let before: u64 =
                        held + pager.released.borrow().iter().map(|&r| len[r]).sum::<u64>();
                    assert!(arena + before + fetching > budget, "released without need");
                }
            }
        }
    }
}
