//! The memory policy of a run: the least a plan can run in, and the budget a session gets
//! once what the process already holds is taken off. One policy for `edgerun generate` and
//! `edgerun serve`.

use edge_schema::memory;
use edge_schema::plan::{ImageSize, PlanMeta};

use crate::error::{BudgetSource, Error, Result};

/// The least a run at `size` can keep resident, in bytes: the largest, over the stages it
/// runs, of the stage's arena, its largest segment pair's weights and the host buffers it runs
/// beside. Also returns those host buffers' bytes (for messages).
pub fn run_floor(meta: &PlanMeta, size: &ImageSize) -> (u64, u64) {
    let charges = memory::tensor_charges(&meta.stages, &meta.tensors);
    let floor = memory::run_order(meta, size)
        .iter()
        .filter_map(|&i| meta.stages.get(i as usize))
        .map(|st| {
            memory::host_bytes_at(meta, size, st)
                + st.arena_size
                + memory::needed_weights(st, true, &|ts: &[u32]| {
                    ts.iter().map(|&t| charges[t as usize]).sum()
                })
        })
        .max()
        .unwrap_or(0);
    (floor, memory::host_bytes(meta, size))
}

/// This process's peak resident set (`VmHWM` of `/proc/self/status`) in bytes; `None` off
/// Linux.
pub fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = s
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// The budget a run gets.
#[derive(Clone, Copy, Debug)]
pub struct RunBudget {
    /// What the session may hold (arena, host buffers, resident weights), bytes: the smaller
    /// of the plan's budget and the caller's, less [`Self::rss_start`]; `None`: unbounded.
    pub session: Option<u64>,
    /// The budget of the whole process, bytes.
    pub whole: Option<u64>,
    /// What the process held when the budget was set (code, metadata, heap, the kernel
    /// threads' stacks) and the heap the session's decoded steps will take
    /// ([`crate::session::decoded_bytes`]), bytes.
    pub rss_start: u64,
}

/// The budget for runs at every size of `sizes` under `max_ram` bytes (the caller's limit,
/// e.g. `--max-ram`) and the plan's own budget (`edgeplan compile --max-ram`), the smaller of
/// the two. The budget covers the whole process: what it already holds is taken off before the
/// arena, the host buffers and the resident weights are planned.
///
/// # Errors
/// [`Error::BudgetTooSmall`] when a size's [`run_floor`] (or the session's arena, sized for the
/// plan's largest stage), alone or beside what the process already holds, exceeds the budget,
/// naming where the budget comes from (a plan compiled for a
/// budget smaller than the runtime itself holds is refused here, not with an arena limit of 0
/// bytes later).
pub fn resolve(meta: &PlanMeta, sizes: &[&ImageSize], max_ram: Option<u64>) -> Result<RunBudget> {
    let (floor, host) = sizes
        .iter()
        .map(|s| run_floor(meta, s))
        .max()
        .unwrap_or((0, 0));
    // The session maps one arena for the plan's largest stage at any size
    // (`crate::session::arena_bytes`) and refuses a budget below it, so that arena is part of
    // the floor even for a run at a smaller size.
    let arena = meta.stages.iter().map(|s| s.arena_size).max().unwrap_or(0);
    let floor = floor.max(arena);
    let whole = match (max_ram, meta.budget) {
        (Some(b), Some(p)) if p <= b => Some((p, BudgetSource::Plan)),
        (Some(b), _) => Some((b, BudgetSource::MaxRam)),
        (None, p) => p.map(|p| (p, BudgetSource::Plan)),
    };
    let too_small = |held: u64| {
        whole
            .filter(|&(b, _)| floor + held > b)
            .map_or(Ok(()), |(budget, whence)| {
                Err(Error::BudgetTooSmall {
                    budget,
                    floor,
                    host,
                    held,
                    whence,
                })
            })
    };
    too_small(0)?;
    // The kernels' worker threads keep the stack pages of their deepest task resident (an
    // attention task holds ~550 KiB there): touch them now so that what the process holds
    // includes them.
    edge_kernels::touch_worker_stacks();
    // The session, created after this, decodes every step once: count that heap too.
    let rss_start = peak_rss_bytes().unwrap_or(0) + crate::session::decoded_bytes(meta);
    too_small(rss_start)?;
    let whole = whole.map(|(b, _)| b);
    Ok(RunBudget {
        session: whole.map(|b| b.saturating_sub(rss_start)),
        whole,
        rss_start,
    })
}

/// The session for runs of `plan` at `sizes` under `rb` ([`resolve`]): its arena refused when
/// it exceeds the budget, weights streamed within it, exact VAE tiles spilling into
/// `spill_dir` (default: the system's temporary folder), which is checked now when a size's
/// decode spills, so a missing or read-only folder is found before any work. The one setup of
/// `edgerun generate` and `edgerun serve`.
///
/// # Errors
/// [`Error::ArenaTooLarge`]; [`Error::Argument`] (`spill-dir`) naming the folder, the size and
/// the bytes its decode would hold there.
pub fn open_session<'p>(
    plan: &'p crate::Plan,
    kernels: edge_kernels::KernelTable,
    rb: &RunBudget,
    spill_dir: Option<std::path::PathBuf>,
    sizes: &[&ImageSize],
) -> Result<crate::Session<'p>> {
    use crate::Executor;
    let mut session = crate::Session::new(plan, kernels, rb.session)?;
    if let Some(b) = rb.session {
        session.limit_budget(b);
    }
    if let Some(d) = spill_dir {
        session.set_spill_dir(d);
    }
    for z in sizes {
        if let Some(bytes) = edge_schema::tiles::spilled_bytes(plan.meta(), z) {
            let dir = session.spill_dir();
            crate::tiling::check_spill_dir(&dir).map_err(|e| Error::Argument {
                flag: "spill-dir",
                reason: format!(
                    "{}: this plan's VAE decode at {}x{} holds {bytes} bytes in a spill file there: {e}",
                    dir.display(),
                    z.width,
                    z.height
                ),
            })?;
        }
    }
    Ok(session)
}
