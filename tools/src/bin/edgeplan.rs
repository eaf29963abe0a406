//! `edgeplan`: the workstation side. Compiles a published PixArt model into a `.plan` file and
//! inspects plans.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use edge_planner::pack::PackPolicy;
use edge_planner::CompileOptions;
use edge_schema::plan::{Isa, Target};
use edge_schema::DType;

#[derive(Parser)]
#[command(name = "edgeplan", version, about = "Compile diffusion models into ahead-of-time plans")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Compile a diffusers PixArt pipeline folder into a plan.
    Compile(CompileArgs),
    /// Print a plan's stages, arena sizes, liveness bounds and weight bytes.
    Inspect {
        /// The plan file.
        plan: PathBuf,
    },
}

#[derive(clap::Args)]
struct CompileArgs {
    /// The diffusers pipeline folder (model_index.json, transformer/, text_encoder/, vae/, tokenizer/, scheduler/).
    model: PathBuf,
    /// Image width in pixels; repeat (or give a comma list) for several sizes, paired with -H.
    #[arg(short = 'W', long = "width", value_delimiter = ',', required = true)]
    width: Vec<u32>,
    /// Image height in pixels; as many as widths (or one, used for every width).
    #[arg(short = 'H', long = "height", value_delimiter = ',', required = true)]
    height: Vec<u32>,
    /// Output plan file.
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
    /// Tokens per prompt (default: 300 for PixArt-Σ, 120 for PixArt-α).
    #[arg(long)]
    max_sequence_length: Option<u32>,
    /// Default type of matrix weights (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k); default: as stored.
    #[arg(long)]
    quant: Option<String>,
    /// Per-tensor override PATTERN=TYPE (substring or * glob over the tensor name); repeatable.
    #[arg(long = "quant-rule")]
    quant_rule: Vec<String>,
    /// Override the VAE config's scaling factor.
    #[arg(long)]
    vae_scale_factor: Option<f32>,
    /// Target the plan is packed for: generic, x86_64, aarch64-neon.
    #[arg(long, default_value = "generic")]
    target: String,
}

fn parse_type(s: &str, flag: &str) -> Result<DType> {
    let d = DType::from_name(s).with_context(|| {
        format!("{flag}: unknown type `{s}` (expected f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k)")
    })?;
    if d == DType::I32 || matches!(d, DType::Q2K | DType::Q3K) {
        bail!("{flag}: type `{s}` cannot be used for weights (expected f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k)");
    }
    Ok(d)
}

fn parse_target(s: &str) -> Result<Target> {
    let (isa, features) = match s {
        "generic" => (Isa::Generic, vec![]),
        "x86_64" | "x86-64" => (Isa::X86_64, vec![]),
        "aarch64" | "aarch64-neon" => (Isa::Aarch64, vec!["neon".to_string()]),
        other => bail!("--target: unknown target `{other}` (expected generic, x86_64, aarch64-neon)"),
    };
    Ok(Target { isa, features })
}

fn compile(a: CompileArgs) -> Result<()> {
    let sizes: Vec<(u32, u32)> = if a.height.len() == a.width.len() {
        a.width.iter().copied().zip(a.height.iter().copied()).collect()
    } else if a.height.len() == 1 {
        a.width.iter().map(|&w| (w, a.height[0])).collect()
    } else if a.width.len() == 1 {
        a.height.iter().map(|&h| (a.width[0], h)).collect()
    } else {
        bail!(
            "-W/-H: {} widths and {} heights; give as many of each (or one of either)",
            a.width.len(),
            a.height.len()
        );
    };
    let mut policy = PackPolicy {
        default: a.quant.as_deref().map(|q| parse_type(q, "--quant")).transpose()?,
        rules: vec![],
    };
    for r in &a.quant_rule {
        let (p, t) = r
            .split_once('=')
            .with_context(|| format!("--quant-rule `{r}`: expected PATTERN=TYPE"))?;
        policy.rules.push((p.to_string(), parse_type(t, "--quant-rule")?));
    }
    let opts = CompileOptions {
        sizes,
        max_sequence_length: a.max_sequence_length,
        policy,
        target: parse_target(&a.target)?,
        vae_scale_factor: a.vae_scale_factor,
    };
    let started = std::time::Instant::now();
    let c = edge_planner::compile_to_file(&a.model, &opts, &a.output)
        .with_context(|| format!("compiling {}", a.model.display()))?;
    let len = std::fs::metadata(&a.output).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "wrote {} ({} bytes, {} stages, {} tensors) in {:.2}s",
        a.output.display(),
        len,
        c.meta.stages.len(),
        c.table.entries.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn inspect(plan: PathBuf) -> Result<()> {
    let bytes = std::fs::read(&plan).with_context(|| format!("reading plan {}", plan.display()))?;
    let meta = edge_planner::inspect::read_meta(&bytes)
        .with_context(|| format!("plan {}", plan.display()))?;
    print!("{}", edge_planner::inspect::summary(&meta, bytes.len() as u64));
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Compile(a) => compile(a),
        Cmd::Inspect { plan } => inspect(plan),
    };
    if let Err(e) = r {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
