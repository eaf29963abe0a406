//! Lowering a [`Graph`] to a plan [`Stage`]: weights into the tensor table, intermediates
//! into the arena (liveness → greedy layout, verified), cut markers into segments, and each
//! segment's first-used weights into one contiguous section.

use edge_graph::{Graph, Source};
use edge_kernels::Call;
use edge_schema::op::Op;
use edge_schema::plan::{ArenaSlice, Segment, Stage, StageKind, Step, Storage, ValueEntry};
use edge_schema::DType;

use crate::arena::{self, Lifetime};
use crate::error::{PlanError, Result};
use crate::pack::PackPolicy;
pub use crate::table::{LoadedWeight, TensorTable, WeightResolver};

fn f32_bytes(shape: &[u64], dtype: DType) -> u64 {
    dtype.bytes_for(shape.iter().product()).unwrap_or(0)
}

/// Lowers `graph` into a stage of `kind` for an image of `width × height` pixels (0 × 0 for
/// the text encoder), adding its weights to `table`.
pub fn lower(
    graph: &Graph,
    kind: StageKind,
    width: u32,
    height: u32,
    table: &mut TensorTable,
    resolver: &dyn WeightResolver,
    policy: &PackPolicy,
) -> Result<Stage> {
    let mut values: Vec<ValueEntry> = Vec::with_capacity(graph.values.len());
    // The denoiser's and the cross-K/V stage's inputs (latents, timestep, K/V cache, mask; T5
    // states) are read where the pipeline keeps them: the cache is not copied into the arena
    // at every step. (The text encoder checks its token ids as they are copied; the VAE's
    // tiled decode writes its input tile into the arena.)
    let bind_inputs = matches!(kind, StageKind::Denoiser | StageKind::CrossKv);
    for (i, v) in graph.values.iter().enumerate() {
        let input = graph.inputs.iter().position(|x| x.idx() == i);
        let storage = match (&v.source, input) {
            (Source::Input, Some(k)) if bind_inputs => Storage::Input(k as u32),
            (Source::Weight(spec), _) => {
                Storage::Weight(table.weight(spec, &v.shape, resolver, policy)?)
            }
            (Source::Const(data), _) => Storage::Weight(table.constant(
                format!("{}.{}", graph.name, v.name),
                &v.shape,
                data,
            )),
            (Source::Input | Source::Node(_), _) => Storage::Arena(ArenaSlice {
                arena: 0,
                offset: 0,
                len: f32_bytes(&v.shape, v.dtype),
            }),
        };
        let dtype = match storage {
            Storage::Weight(t) => table.entries[t as usize].dtype,
            Storage::Arena(_) | Storage::Input(_) => v.dtype,
        };
        values.push(ValueEntry {
            dtype,
            shape: v.shape.clone(),
            storage,
        });
    }
    let (steps, arena_size, live_lower_bound) = plan_memory(graph, &mut values)?;
    let n = steps.len();
    // Segments from cut markers; each segment's new weights form one section.
    let mut bounds: Vec<(usize, String)> = vec![(0, format!("{}.start", graph.name))];
    for c in &graph.cuts {
        if c.at_node == 0 {
            bounds[0].1 = c.label.clone();
        } else if c.at_node < n && bounds.last().is_some_and(|b| b.0 < c.at_node) {
            bounds.push((c.at_node, c.label.clone()));
        }
    }
    let mut segments = Vec::with_capacity(bounds.len());
    for (j, (start, label)) in bounds.iter().enumerate() {
        let end = bounds.get(j + 1).map_or(n, |b| b.0);
        let used = edge_schema::memory::step_tensors(&steps[*start..end], &values);
        segments.push(Segment {
            first_step: *start as u32,
            end_step: end as u32,
            label: label.clone(),
            section: table.assign_section(&used),
        });
    }
    Ok(Stage {
        name: graph.name.clone(),
        kind,
        width,
        height,
        values,
        steps,
        segments,
        inputs: graph.inputs.iter().map(|v| v.0).collect(),
        outputs: graph.outputs.iter().map(|v| v.0).collect(),
        arena_size,
        live_lower_bound,
        segmented: false,
    })
}

/// Lifetimes, the verified greedy arena layout and per-step scratch for `graph` whose values
/// have the storage kinds in `values` (arena offsets are filled in). Returns the steps, the
/// arena size and the liveness lower bound.
fn plan_memory(graph: &Graph, values: &mut [ValueEntry]) -> Result<(Vec<Step>, u64, u64)> {
    let nv = values.len();
    let root = alias_roots(graph, values);
    // Lifetimes per root, in steps; inputs live from 0, outputs to the end.
    let n = graph.nodes.len();
    let mut first = vec![usize::MAX; nv];
    let mut last = vec![0usize; nv];
    for &i in &graph.inputs {
        first[root[i.idx()].0] = 0;
    }
    for (k, node) in graph.nodes.iter().enumerate() {
        for &i in &node.inputs {
            let r = root[i.idx()].0;
            last[r] = last[r].max(k);
        }
        let r = root[node.output.idx()].0;
        first[r] = first[r].min(k);
        last[r] = last[r].max(k);
    }
    for &o in &graph.outputs {
        last[root[o.idx()].0] = n;
    }
    // Steps with scratch sizes.
    let mut steps: Vec<Step> = Vec::with_capacity(n);
    let mut scratch_sizes = Vec::with_capacity(n);
    for node in &graph.nodes {
        let ins: Vec<(&[u64], DType)> = node
            .inputs
            .iter()
            .map(|i| (values[i.idx()].shape.as_slice(), values[i.idx()].dtype))
            .collect();
        let out = values[node.output.idx()].shape.as_slice();
        let call = Call::decode(&node.op, &ins, out).map_err(PlanError::Internal)?;
        scratch_sizes.push(call.scratch_bytes() as u64);
        steps.push(Step {
            op: node.op.clone(),
            inputs: node.inputs.iter().map(|i| i.0).collect(),
            outputs: vec![node.output.0],
            scratch: None,
        });
    }
    // Arena layout over roots and scratch buffers.
    let mut lifetimes = Vec::new();
    let mut owners: Vec<Result<usize, usize>> = Vec::new(); // Ok(value root) / Err(step)
    for r in 0..nv {
        if root[r].0 == r && first[r] != usize::MAX {
            if let Storage::Arena(a) = values[r].storage {
                lifetimes.push(Lifetime {
                    first: first[r],
                    last: last[r].max(first[r]),
                    size: a.len,
                });
                owners.push(Ok(r));
            }
        }
    }
    for (k, &s) in scratch_sizes.iter().enumerate() {
        if s > 0 {
            lifetimes.push(Lifetime {
                first: k,
                last: k,
                size: s,
            });
            owners.push(Err(k));
        }
    }
    let (offsets, arena_size) = arena::plan_greedy(&lifetimes);
    if let Err((a, b)) = arena::verify(&lifetimes, &offsets, arena_size) {
        return Err(PlanError::Internal(format!(
            "arena layout of {} overlaps tensors {a} and {b}",
            graph.name
        )));
    }
    let live_lower_bound = arena::live_lower_bound(&lifetimes);
    let mut offset_of_root = vec![None; nv];
    for (j, owner) in owners.iter().enumerate() {
        match owner {
            Ok(r) => offset_of_root[*r] = Some(offsets[j]),
            Err(k) => {
                steps[*k].scratch = Some(ArenaSlice {
                    arena: 0,
                    offset: offsets[j],
                    len: lifetimes[j].size,
                })
            }
        }
    }
    for (i, v) in values.iter_mut().enumerate() {
        if let Storage::Arena(a) = &mut v.storage {
            let (r, within) = root[i];
            a.offset = offset_of_root[r].unwrap_or(0) + within;
        }
    }
    Ok((steps, arena_size, live_lower_bound))
}

/// For every value, the arena slot it lives in as `(root value, byte offset inside the root's
/// slot)`: a reshape's output shares its input's slot, and the inputs of a concatenation along
/// its outermost non-unit-prefix axis are placed back to back inside the output's slot
/// (in-place concatenation: the concat step then copies nothing). An input is placed so only
/// if it is produced in the stage (not a stage input or output, not a weight), is not itself
/// holding placed inputs, and is placed into no earlier concatenation; otherwise the concat
/// copies as usual. The verifier accepts exactly these overlaps (`verify_liveness`).
fn alias_roots(graph: &Graph, values: &[ValueEntry]) -> Vec<(usize, u64)> {
    let nv = values.len();
    let arena = |i: usize| matches!(values[i].storage, Storage::Arena(_));
    let mut parent: Vec<(usize, u64)> = (0..nv).map(|i| (i, 0)).collect();
    let resolve = |parent: &[(usize, u64)], mut i: usize| -> (usize, u64) {
        let mut off = 0;
        while parent[i].0 != i {
            off += parent[i].1;
            i = parent[i].0;
        }
        (i, off)
    };
    let mut holds_parts = vec![false; nv];
    let io: Vec<usize> = graph
        .inputs
        .iter()
        .chain(&graph.outputs)
        .map(|v| v.idx())
        .collect();
    for node in &graph.nodes {
        let out = node.output.idx();
        match node.op {
            Op::Reshape => {
                let src = node.inputs[0].idx();
                if arena(src) {
                    parent[out] = (src, 0);
                }
            }
            Op::Concat { axis } => {
                let shape = &values[out].shape;
                let contiguous = shape[..usize::from(axis)].iter().all(|&d| d == 1);
                let roots: Vec<(usize, u64)> = node
                    .inputs
                    .iter()
                    .map(|i| resolve(&parent, i.idx()))
                    .collect();
                let distinct = roots
                    .iter()
                    .enumerate()
                    .all(|(j, r)| roots[..j].iter().all(|q| q.0 != r.0));
                let eligible = contiguous
                    && arena(out)
                    && distinct
                    && roots.iter().all(|&(r, within)| {
                        within == 0
                            && arena(r)
                            && !holds_parts[r]
                            && !io.iter().any(|&x| resolve(&parent, x).0 == r)
                    });
                if eligible {
                    let mut off = 0;
                    for &(r, _) in &roots {
                        parent[r] = (out, off);
                        off += f32_bytes(&values[r].shape, values[r].dtype);
                    }
                    holds_parts[out] = true;
                }
            }
            _ => {}
        }
    }
    (0..nv).map(|i| resolve(&parent, i)).collect()
}

/// `graph` as a stage with every weight assumed `weight_dtype` and no weights loaded: values,
/// steps and the arena layout, no segments (for planning decisions such as the VAE tile size
/// and mode, before any weight is read).
pub fn skeleton_stage(graph: &Graph, kind: StageKind, weight_dtype: DType) -> Result<Stage> {
    let mut values: Vec<ValueEntry> = graph
        .values
        .iter()
        .map(|v| {
            let weight = matches!(v.source, Source::Weight(_) | Source::Const(_));
            ValueEntry {
                dtype: if weight { weight_dtype } else { v.dtype },
                shape: v.shape.clone(),
                storage: if weight {
                    Storage::Weight(0)
                } else {
                    Storage::Arena(ArenaSlice {
                        arena: 0,
                        offset: 0,
                        len: f32_bytes(&v.shape, v.dtype),
                    })
                },
            }
        })
        .collect();
    let (steps, arena_size, live_lower_bound) = plan_memory(graph, &mut values)?;
    Ok(Stage {
        name: graph.name.clone(),
        kind,
        width: 0,
        height: 0,
        values,
        steps,
        segments: vec![],
        inputs: graph.inputs.iter().map(|v| v.0).collect(),
        outputs: graph.outputs.iter().map(|v| v.0).collect(),
        arena_size,
        live_lower_bound,
        segmented: false,
    })
}

/// The arena a graph needs, assuming `weight_dtype` for every weight (for planning
/// decisions such as the VAE tile size, before any weight is loaded).
pub fn arena_estimate(graph: &Graph, weight_dtype: DType) -> Result<u64> {
    Ok(skeleton_stage(graph, StageKind::VaeDecoder, weight_dtype)?.arena_size)
}
