//! Planner errors: each names the file, tensor, stage or flag and what was expected.

use crate::load::LoadError;

/// Why a plan could not be compiled or written.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("{0}")]
    Model(#[from] edge_models::ModelError),
    #[error("{0}")]
    Graph(#[from] edge_graph::Error),
    #[error("tensor `{tensor}` is missing from {source_desc}")]
    MissingWeight { tensor: String, source_desc: String },
    #[error("tensor `{tensor}` in {source_desc} has shape {found:?}, expected {expected:?}")]
    WeightShape {
        tensor: String,
        source_desc: String,
        found: Vec<u64>,
        expected: Vec<u64>,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the compiled plan does not verify (planner bug): {0}")]
    Verify(#[from] edge_schema::Error),
    #[error("planner bug: {0}")]
    Internal(String),
}

/// Result with [`PlanError`].
pub type Result<T, E = PlanError> = std::result::Result<T, E>;
