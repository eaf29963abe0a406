//! Where the current bytes of each value of one stage are, for an executor that keeps a device
//! copy of the arena beside the host's (the CUDA executor): on the device, on the host, or both.
//! A step reads its inputs on the side it runs and writes its output there; a value crosses
//! to the other side only when a step there reads it. Pure bookkeeping, tested without a GPU.

/// The copy that makes a value readable on one side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Move {
    /// Already there, or never written (nothing to copy).
    None,
    /// Host → device.
    ToDevice,
    /// Device → host.
    ToHost,
}

/// Per value of the tracked stage: whether the device's and the host's bytes are current.
#[derive(Clone, Debug, Default)]
pub struct Residency {
    stage: Option<u32>,
    device: Vec<bool>,
    host: Vec<bool>,
}

impl Residency {
    /// Tracks stage `stage` of `values` values; a different stage than the tracked one (or
    /// `fresh`) starts with nothing current on either side (stages share the arena).
    pub fn track(&mut self, stage: u32, values: usize, fresh: bool) {
        if fresh || self.stage != Some(stage) {
            self.stage = Some(stage);
            self.device = vec![false; values];
            self.host = vec![false; values];
        }
    }

    /// The stage tracked, if any.
    pub fn stage(&self) -> Option<u32> {
        self.stage
    }

    /// The copy that makes value `id` readable on the device (`on_device`) or on the host.
    pub fn need(&self, id: u32, on_device: bool) -> Move {
        let i = id as usize;
        let (d, h) = (self.on_device(i), self.on_host(i));
        match (on_device, d, h) {
            (true, false, true) => Move::ToDevice,
            (false, true, false) => Move::ToHost,
            _ => Move::None,
        }
    }

    /// Records that `m` was done for value `id`: both sides hold it now.
    pub fn moved(&mut self, id: u32, m: Move) {
        let i = id as usize;
        match m {
            Move::ToDevice => set(&mut self.device, i, true),
            Move::ToHost => set(&mut self.host, i, true),
            Move::None => {}
        }
    }

    /// Records that value `id` was written on the device (`on_device`) or on the host: only
    /// that side is current.
    pub fn written(&mut self, id: u32, on_device: bool) {
        let i = id as usize;
        set(&mut self.device, i, on_device);
        set(&mut self.host, i, !on_device);
    }

    /// Whether every value of `ids` is current on the device.
    pub fn all_on_device(&self, ids: &[u32]) -> bool {
        ids.iter().all(|&v| self.on_device(v as usize))
    }

    /// An output that shares its inputs' bytes (a reshape in place, a concatenation whose
    /// inputs were written inside it): on the device if every input is there, else the caller
    /// must first bring every input to the host (the returned `false`), after which the output
    /// is on the host. Records the output's sides accordingly.
    pub fn in_place(&mut self, inputs: &[u32], out: u32) -> bool {
        let all_device = self.all_on_device(inputs);
        let all_host = inputs.iter().all(|&v| self.on_host(v as usize));
        let o = out as usize;
        set(&mut self.device, o, all_device);
        set(&mut self.host, o, all_host || !all_device);
        all_device
    }

    /// Whether value `id`'s current bytes are on the device only.
    pub fn device_only(&self, id: u32) -> bool {
        self.on_device(id as usize) && !self.on_host(id as usize)
    }

    fn on_device(&self, i: usize) -> bool {
        self.device.get(i).copied().unwrap_or(false)
    }

    fn on_host(&self, i: usize) -> bool {
        self.host.get(i).copied().unwrap_or(false)
    }
}

fn set(v: &mut [bool], i: usize, x: bool) {
    if let Some(b) = v.get_mut(i) {
        *b = x;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_crosses_only_when_the_other_side_reads_it() {
        let mut r = Residency::default();
        r.track(0, 4, true);
        // Never written: nothing to copy either way.
        assert_eq!(r.need(0, true), Move::None);
        // A stage input written on the host, read by a device step: one upload.
        r.written(0, false);
        assert_eq!(r.need(0, true), Move::ToDevice);
        r.moved(0, Move::ToDevice);
        assert_eq!(r.need(0, true), Move::None);
        assert_eq!(r.need(0, false), Move::None);
        // A device step's output read by a host step: one download, then both current.
        r.written(1, true);
        assert!(r.device_only(1));
        assert_eq!(r.need(1, true), Move::None);
        assert_eq!(r.need(1, false), Move::ToHost);
        r.moved(1, Move::ToHost);
        assert!(!r.device_only(1));
        // Rewritten on the device (a later value in the same slot): the host copy is stale.
        r.written(1, true);
        assert_eq!(r.need(1, false), Move::ToHost);
    }

    #[test]
    fn in_place_outputs_follow_their_inputs() {
        let mut r = Residency::default();
        r.track(2, 6, true);
        r.written(0, true);
        r.written(1, true);
        assert!(r.in_place(&[0, 1], 2), "all inputs on the device");
        assert!(r.device_only(2));
        // One input on the host only: everything goes to the host first.
        r.written(3, false);
        assert!(!r.in_place(&[0, 3], 4));
        assert_eq!(r.need(4, false), Move::None);
        assert_eq!(r.need(4, true), Move::ToDevice);
        // Inputs on both sides: the output is current on both.
        r.moved(0, Move::ToHost);
        r.moved(3, Move::ToDevice);
        assert!(r.in_place(&[0, 3], 5));
        assert_eq!(r.need(5, true), Move::None);
        assert_eq!(r.need(5, false), Move::None);
    }

    #[test]
    fn another_stage_or_a_fresh_run_starts_with_nothing_current() {
        let mut r = Residency::default();
        r.track(0, 3, true);
        r.written(2, true);
        r.track(0, 3, false);
        assert!(
            r.device_only(2),
            "the same stage keeps its values (exact tiles)"
        );
        r.track(1, 3, false);
        assert_eq!(r.stage(), Some(1));
        assert!(!r.device_only(2));
        r.written(2, true);
        r.track(1, 3, true);
        assert!(!r.device_only(2), "a new run of the stage");
        // Ids beyond the stage's values are never current and never panic.
        assert_eq!(r.need(99, true), Move::None);
        r.written(99, true);
        assert!(!r.in_place(&[99], 98));
    }
}
