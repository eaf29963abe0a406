//! Host-only graph IR: values with facts (shape + dtype), nodes carrying a [`schema::op::Op`],
//! cut markers at block boundaries, and shape inference on construction.
//!
//! A [`Graph`] is a static single-assignment list of nodes in execution order. Values are
//! inputs (bound at run time), weights (named checkpoint tensors, possibly assembled from
//! parts), constants computed by the model builder (e.g. a 2-D sin-cos position table), or node
//! outputs. Shapes are written outermost-first (PyTorch order). The runtime never sees this
//! crate: the planner lowers a graph to a plan stage.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::fmt::Write as _;

use edge_schema::op::Op;
use edge_schema::DType;

pub use edge_schema as schema;

/// Index of a value in [`Graph::values`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

impl ValueId {
    /// The index as `usize`.
    pub fn idx(self) -> usize {
        self.0 as usize
    }
}

/// What role a weight plays; the planner's packing rules depend on it (only matrices are ever
/// quantized; convolution kernels keep their stored float type).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightKind {
    /// A Linear weight `[out, in]`: may be quantized.
    Matrix,
    /// A convolution kernel `[cout, cin, kh, kw]`.
    ConvKernel,
    /// A bias or norm scale: stays f32.
    Vector,
    /// An embedding table `[rows, d]`: stays f32/f16.
    Embedding,
    /// A table sliced element-wise (`scale_shift_table`, relative-attention bias): stays f32.
    Table,
}

/// A weight as the checkpoint holds it: one tensor, or several concatenated along axis 0
/// (fused projections such as q/k/v → qkv).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WeightSpec {
    /// Canonical (diffusers-layout) tensor names; more than one means row concatenation.
    pub parts: Vec<String>,
    pub kind: WeightKind,
}

/// Where a value comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// A stage input, bound at run time.
    Input,
    /// A checkpoint weight.
    Weight(WeightSpec),
    /// A constant computed by the builder (f32 data, row-major).
    Const(Vec<f32>),
    /// The output of node `n`.
    Node(usize),
}

/// A value: its fact and its source.
#[derive(Clone, Debug, PartialEq)]
pub struct Value {
    /// A readable name for dumps and errors (identity is the [`ValueId`]).
    pub name: String,
    /// Shape, outermost-first.
    pub shape: Vec<u64>,
    pub dtype: DType,
    pub source: Source,
}

/// One operation producing one value.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub op: Op,
    pub inputs: Vec<ValueId>,
    pub output: ValueId,
}

/// A graph-cut marker: a segment boundary before node `at_node`, at a block boundary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cut {
    pub at_node: usize,
    /// The block that starts here, e.g. `transformer_blocks.3`.
    pub label: String,
}

/// Errors of building a graph.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("graph `{graph}`, node `{node}`: {msg}")]
    Shape {
        graph: String,
        node: String,
        msg: String,
    },
    #[error("graph `{graph}`: constant `{name}` has {got} values for shape {shape:?}")]
    ConstSize {
        graph: String,
        name: String,
        got: usize,
        shape: Vec<u64>,
    },
    #[error("graph `{graph}`: weight `{name}` declared twice with shapes {a:?} and {b:?}")]
    WeightConflict {
        graph: String,
        name: String,
        a: Vec<u64>,
        b: Vec<u64>,
    },
}

/// Result with the graph [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A static graph in execution order.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub name: String,
    pub values: Vec<Value>,
    pub nodes: Vec<Node>,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    pub cuts: Vec<Cut>,
    weights: HashMap<Vec<String>, ValueId>,
}

fn to_u64(shape: &[usize]) -> Vec<u64> {
    shape.iter().map(|&d| d as u64).collect()
}

impl Graph {
    /// An empty graph called `name`.
    pub fn new(name: impl Into<String>) -> Graph {
        Graph {
            name: name.into(),
            ..Graph::default()
        }
    }

    fn push(&mut self, v: Value) -> ValueId {
        self.values.push(v);
        ValueId((self.values.len() - 1) as u32)
    }

    /// Declares a run-time input of `shape` (outermost-first) and `dtype`.
    pub fn input(&mut self, name: &str, shape: &[usize], dtype: DType) -> ValueId {
        let id = self.push(Value {
            name: name.into(),
            shape: to_u64(shape),
            dtype,
            source: Source::Input,
        });
        self.inputs.push(id);
        id
    }

    /// Declares the checkpoint weight `name` with its expected `shape`. Declaring the same
    /// weight twice returns the same value.
    pub fn weight(&mut self, name: &str, shape: &[usize], kind: WeightKind) -> Result<ValueId> {
        self.weight_concat(&[name.to_string()], shape, kind)
    }

    /// Declares a weight made of `parts` concatenated along axis 0 (e.g. `to_q`, `to_k`,
    /// `to_v` → fused qkv); `shape` is the fused shape.
    pub fn weight_concat(
        &mut self,
        parts: &[String],
        shape: &[usize],
        kind: WeightKind,
    ) -> Result<ValueId> {
        let shape = to_u64(shape);
        if let Some(&id) = self.weights.get(parts) {
            let old = &self.values[id.idx()].shape;
            if *old != shape {
                return Err(Error::WeightConflict {
                    graph: self.name.clone(),
                    name: parts.join("+"),
                    a: old.clone(),
                    b: shape,
                });
            }
            return Ok(id);
        }
        let id = self.push(Value {
            name: parts.join("+"),
            shape,
            dtype: DType::F32,
            source: Source::Weight(WeightSpec {
                parts: parts.to_vec(),
                kind,
            }),
        });
        self.weights.insert(parts.to_vec(), id);
        Ok(id)
    }

    /// A constant tensor (f32, row-major).
    pub fn constant(&mut self, name: &str, shape: &[usize], data: Vec<f32>) -> Result<ValueId> {
        let n: usize = shape.iter().product();
        if n != data.len() {
            return Err(Error::ConstSize {
                graph: self.name.clone(),
                name: name.into(),
                got: data.len(),
                shape: to_u64(shape),
            });
        }
        Ok(self.push(Value {
            name: name.into(),
            shape: to_u64(shape),
            dtype: DType::F32,
            source: Source::Const(data),
        }))
    }

    /// Appends a node; its output shape is inferred.
    pub fn op(&mut self, name: &str, op: Op, inputs: &[ValueId]) -> Result<ValueId> {
        self.op_hint(name, op, inputs, None)
    }

    /// Appends a node whose output shape must be given (`Reshape`, `TimestepEmbedding`,
    /// `T5PositionBias`).
    pub fn op_shaped(
        &mut self,
        name: &str,
        op: Op,
        inputs: &[ValueId],
        shape: &[usize],
    ) -> Result<ValueId> {
        self.op_hint(name, op, inputs, Some(&to_u64(shape)))
    }

    fn op_hint(
        &mut self,
        name: &str,
        op: Op,
        inputs: &[ValueId],
        hint: Option<&[u64]>,
    ) -> Result<ValueId> {
        let facts: Vec<(&[u64], DType)> = inputs
            .iter()
            .map(|v| {
                let v = &self.values[v.idx()];
                (v.shape.as_slice(), v.dtype)
            })
            .collect();
        let (shape, dtype) = op.infer(&facts, hint).map_err(|msg| Error::Shape {
            graph: self.name.clone(),
            node: name.into(),
            msg,
        })?;
        let out = self.push(Value {
            name: name.into(),
            shape,
            dtype,
            source: Source::Node(self.nodes.len()),
        });
        self.nodes.push(Node {
            op,
            inputs: inputs.to_vec(),
            output: out,
        });
        Ok(out)
    }

    /// Marks a segment boundary before the next node.
    pub fn cut(&mut self, label: impl Into<String>) {
        self.cuts.push(Cut {
            at_node: self.nodes.len(),
            label: label.into(),
        });
    }

    /// Marks `v` as a graph output.
    pub fn output(&mut self, v: ValueId) {
        self.outputs.push(v);
    }

    /// The shape of `v`, outermost-first.
    pub fn shape(&self, v: ValueId) -> &[u64] {
        &self.values[v.idx()].shape
    }

    /// The shape of `v` as `usize`s.
    pub fn dims(&self, v: ValueId) -> Vec<usize> {
        self.shape(v).iter().map(|&d| d as usize).collect()
    }

    /// A text dump: one line per value source and node, with cut markers.
    pub fn dump(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "graph {}", self.name);
        for (i, v) in self.values.iter().enumerate() {
            let src = match &v.source {
                Source::Input => "input".to_string(),
                Source::Weight(w) => format!("weight {:?}", w.kind),
                Source::Const(_) => "const".to_string(),
                Source::Node(_) => continue,
            };
            let _ = writeln!(s, "  %{i} {} {:?} {} = {src}", v.dtype, v.shape, v.name);
        }
        let mut cuts = self.cuts.iter().peekable();
        for (n, node) in self.nodes.iter().enumerate() {
            while let Some(c) = cuts.next_if(|c| c.at_node == n) {
                let _ = writeln!(s, "  -- cut: {}", c.label);
            }
            let out = &self.values[node.output.idx()];
            let ins: Vec<String> = node.inputs.iter().map(|v| format!("%{}", v.0)).collect();
            let _ = writeln!(
                s,
                "  %{} {:?} {} = {}({})",
                node.output.0,
                out.shape,
                out.name,
                node.op.label(),
                ins.join(", ")
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn infers_linear_and_rejects_mismatch() {
        let mut g = Graph::new("t");
        let x = g.input("x", &[5, 8], DType::F32);
        let w = g.weight("w", &[3, 8], WeightKind::Matrix).unwrap();
        let y = g.op("y", Op::linear(false), &[x, w]).unwrap();
        assert_eq!(g.shape(y), &[5, 3]);
        let w2 = g.weight("w2", &[3, 7], WeightKind::Matrix).unwrap();
        let err = g.op("bad", Op::linear(false), &[x, w2]).unwrap_err();
        assert!(err.to_string().contains("bad"), "{err}");
    }

    #[test]
    fn same_weight_is_one_value_and_conflicts_are_errors() {
        let mut g = Graph::new("t");
        let a = g.weight("w", &[2, 2], WeightKind::Matrix).unwrap();
        let b = g.weight("w", &[2, 2], WeightKind::Matrix).unwrap();
        assert_eq!(a, b);
        assert!(g.weight("w", &[2, 3], WeightKind::Matrix).is_err());
    }
}
