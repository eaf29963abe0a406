//! Runtime errors. No `String` catch-all: each variant says what was wrong.

/// Why the runtime refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Plan(#[from] edge_schema::Error),
    #[error("plan {path}: {source}")]
    PlanFile {
        path: String,
        #[source]
        source: edge_schema::Error,
    },
    #[error("plan signature: {0}")]
    Signature(#[from] crate::sign::SignatureError),
    #[error("plan {path}: signature: {source}")]
    SignatureFile {
        path: String,
        #[source]
        source: crate::sign::SignatureError,
    },
    #[error("init image {path}: {reason}")]
    InitImage { path: String, reason: String },
    #[error("the plan has no image size {width}x{height} (WxH); it holds: {available}")]
    SizeNotInPlan {
        width: u32,
        height: u32,
        available: String,
    },
    #[error(
        "stage {stage}: input {index} has {got} elements, expected {expected} (shape {shape:?})"
    )]
    InputSize {
        stage: String,
        index: usize,
        got: usize,
        expected: usize,
        shape: Vec<u64>,
    },
    #[error(
        "stage {stage}: called with {inputs} inputs and {outputs} outputs, expected {want_inputs} and {want_outputs}"
    )]
    StageArity {
        stage: String,
        inputs: usize,
        outputs: usize,
        want_inputs: usize,
        want_outputs: usize,
    },
    #[error("token id {id} is outside the embedding table ({rows} rows)")]
    TokenId { id: i64, rows: u32 },
    #[error("tokenizer in plan: {0}")]
    Tokenizer(String),
    #[error("sampler: {0}")]
    Sampler(#[from] crate::sampler::SamplerError),
    #[error("the plan needs an arena of {needed} bytes, more than the {limit}-byte limit")]
    ArenaTooLarge { needed: u64, limit: u64 },
    #[error("--{flag}: {reason}")]
    Argument { flag: &'static str, reason: String },
    #[error("writing {path}: {reason}")]
    Output { path: String, reason: String },
    #[error("plan {path} is locked for writing by another process (an updater replacing it in place); run again when it is done")]
    PlanLocked { path: String },
    #[error("plan {path} changed while in use ({what}); nothing was written. Replace a plan by writing the new file elsewhere and renaming it over the old one")]
    PlanChanged { path: String, what: String },
    #[error("the plan needs at least {floor} bytes (a stage's arena, its largest segments' weights and {host} bytes of host buffers){}, more than the budget of {budget} bytes ({whence})", if *held > 0 { format!(" beside the {held} bytes the process already holds, {} bytes in all", floor + held) } else { String::new() })]
    BudgetTooSmall {
        budget: u64,
        floor: u64,
        host: u64,
        held: u64,
        /// Where the budget comes from.
        whence: BudgetSource,
    },
    /// With finiteness checks on, the first step whose output holds NaN or infinity.
    #[error("stage {stage}: step {step} ({op}) produced {what} (the first non-finite output of this run)")]
    NonFinite {
        stage: String,
        step: usize,
        op: String,
        what: String,
    },
    /// A GPU failure (no driver or device, out of memory, a failed launch), naming the device.
    #[error("GPU: {0}")]
    Gpu(String),
    #[error("interrupted after {after}; no image")]
    Interrupted { after: String },
    #[error("sampling diverged: the latents hold NaN or infinity after step {step} (guidance scale {cfg_scale}; values far outside 1…20 overflow f32)")]
    Diverged { step: usize, cfg_scale: f32 },
}

/// Where a run's memory budget comes from ([`Error::BudgetTooSmall`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetSource {
    /// The caller's limit (`--max-ram`).
    MaxRam,
    /// The plan's own budget (`edgeplan compile --max-ram`).
    Plan,
}

impl std::fmt::Display for BudgetSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BudgetSource::MaxRam => "--max-ram",
            BudgetSource::Plan => {
                "the plan's own, from edgeplan compile --max-ram, which a run cannot raise; \
                 recompile with a larger --max-ram, or a --planning-headroom that leaves room \
                 for the process itself"
            }
        })
    }
}

impl Error {
    /// Attaches the plan path to a format error.
    pub fn in_file(self, path: &std::path::Path) -> Error {
        match self {
            Error::Plan(source) => Error::PlanFile {
                path: path.display().to_string(),
                source,
            },
            Error::Signature(source) => Error::SignatureFile {
                path: path.display().to_string(),
                source,
            },
            other => other,
        }
    }
}

/// Result with the runtime [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
