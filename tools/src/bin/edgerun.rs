//! `edgerun`: the device side. Generates an image from a plan.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[path = "../common.rs"]
#[macro_use]
mod common;

use common::{
    check_output_dir, check_output_file, one_line, parse_size, read_file, refuse_clobber,
};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use edge_runtime::pipeline::{available_sizes, Progress};
use edge_runtime::sampler::SamplingMethod;
use edge_runtime::{Executor, GenerateParams, Plan, Session};
use edge_schema::plan::PackLayout;
use edge_schema::DType;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

#[derive(Parser)]
#[command(name = "edgerun", version, about = "Run ahead-of-time diffusion plans")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate an image from a prompt.
    Generate(Box<GenArgs>),
    /// Time the stages of a plan and profile its ops against this machine's measured peaks.
    Bench(BenchArgs),
    /// Serve one plan over HTTP: OpenAI images API (`POST /v1/images/generations`),
    /// AUTOMATIC1111 API (`/sdapi/v1/txt2img`, `progress`, `interrupt`, `samplers`), a page at
    /// `/`. Jobs run one at a time from a bounded queue.
    Serve(ServeArgs),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// The plan file (from `edgeplan compile`), opened and verified once.
    #[arg(long)]
    plan: PathBuf,
    /// Refuse the plan unless it is signed by this Ed25519 public key (KEY.pub).
    #[arg(long = "trusted-key")]
    trusted_key: Option<PathBuf>,
    /// Address to listen on (`0.0.0.0` for every interface).
    #[arg(long = "listen-ip", default_value = "127.0.0.1")]
    listen_ip: std::net::IpAddr,
    /// Port to listen on (0: a free one, printed at start).
    #[arg(
        long = "listen-port",
        default_value_t = 1234,
        allow_negative_numbers = true
    )]
    listen_port: u16,
    /// Require `Authorization: Bearer KEY` on every route but `/` and `/health`.
    #[arg(long = "api-key")]
    api_key: Option<String>,
    /// Read the API key from this file (first line) instead of the command line, where other
    /// users can see it.
    #[arg(long = "api-key-file", conflicts_with = "api_key")]
    api_key_file: Option<PathBuf>,
    /// Memory budget of the whole process (e.g. `1.5G`): checked once at start; every job runs
    /// inside it.
    #[arg(long = "max-ram", allow_hyphen_values = true)]
    max_ram: Option<String>,
    /// Jobs that may wait or run at once; one more gets 429.
    #[arg(long, default_value_t = 16)]
    queue: usize,
    /// A job running longer than this many seconds is stopped at its next step (504).
    #[arg(long, default_value_t = 600.0, allow_hyphen_values = true)]
    timeout: f64,
    /// Connections open at once (one more gets 503). The HTTP side may hold this many request
    /// bodies (`--max-body` each), taken off `--max-ram`.
    #[arg(long = "max-connections", default_value_t = 64)]
    max_connections: usize,
    /// Seconds a client has to send its request headers (then the connection is closed).
    #[arg(
        long = "header-timeout",
        default_value_t = 10.0,
        allow_hyphen_values = true
    )]
    header_timeout: f64,
    /// Seconds a client has to send its request body (then 408).
    #[arg(
        long = "body-timeout",
        default_value_t = 30.0,
        allow_hyphen_values = true
    )]
    body_timeout: f64,
    /// The most sampler steps a request may ask for.
    #[arg(long = "max-steps", default_value_t = 150)]
    max_steps: usize,
    /// The most images one request may ask for (`n`, `batch_size` × `n_iter`).
    #[arg(long = "max-images", default_value_t = 8)]
    max_images: usize,
    /// Largest request body (e.g. `1M`); a larger one gets 413.
    #[arg(long = "max-body", default_value = "1M")]
    max_body: String,
    /// Worker threads of the kernels (default: one per core).
    #[arg(
        short = 't',
        long = "threads",
        allow_negative_numbers = true,
        default_value_t = 0
    )]
    threads: usize,
    /// Kernel table: `best` or a label `edgerun generate -v` lists.
    #[arg(long = "kernels", default_value = "best")]
    kernels: String,
    /// Folder for the spill file of exact VAE tiles (default: the system's temporary folder).
    #[arg(long = "spill-dir")]
    spill_dir: Option<PathBuf>,
}

fn serve(a: ServeArgs) -> Result<()> {
    for (flag, v, max) in [
        ("--queue", a.queue, 4096),
        ("--max-steps", a.max_steps, 10_000),
        ("--max-images", a.max_images, 1000),
        ("--max-connections", a.max_connections, 4096),
    ] {
        if !(1..=max).contains(&v) {
            bail!("{flag} {v}: expected 1 to {max}");
        }
    }
    for (flag, v) in [
        ("--timeout", a.timeout),
        ("--header-timeout", a.header_timeout),
        ("--body-timeout", a.body_timeout),
    ] {
        if !(v.is_finite() && v > 0.0 && v <= 1e6) {
            bail!("{flag} {v}: expected a number of seconds above 0 and at most 1000000");
        }
    }
    let max_body = parse_size(&a.max_body, "--max-body")?;
    let api_key = match (&a.api_key, &a.api_key_file) {
        (Some(k), _) => Some(k.clone()),
        (None, Some(f)) => {
            let text = String::from_utf8(read_file(f, "--api-key-file")?)
                .map_err(|_| anyhow::anyhow!("--api-key-file {}: not UTF-8 text", f.display()))?;
            Some(text.lines().next().unwrap_or_default().trim().to_string())
        }
        (None, None) => None,
    };
    if api_key
        .as_deref()
        .is_some_and(|k| k.is_empty() || k.chars().any(|c| c.is_whitespace() || c.is_control()))
    {
        bail!(
            "{}: expected a key of at least one character, without spaces",
            if a.api_key.is_some() {
                "--api-key".to_string()
            } else {
                format!(
                    "--api-key-file {}",
                    a.api_key_file.as_deref().unwrap_or(Path::new("")).display()
                )
            }
        );
    }
    if api_key.is_none() && !a.listen_ip.is_loopback() {
        say!(
            "warning: --listen-ip {}: serving beyond this host without --api-key; anyone who can reach the port can use it",
            a.listen_ip
        );
    }
    start_threads(a.threads)?;
    let (_, kernels) = pick_kernels(&a.kernels)?;
    let trusted_key = a
        .trusted_key
        .as_deref()
        .map(edge_runtime::TrustedKey::from_file)
        .transpose()?;
    let max_ram = a
        .max_ram
        .as_deref()
        .map(|s| parse_size(s, "--max-ram"))
        .transpose()?;
    edge_serve::serve(edge_serve::ServeConfig {
        worker: edge_serve::queue::WorkerConfig {
            plan: a.plan,
            trusted_key,
            kernels,
            max_ram,
            spill_dir: a.spill_dir,
            queue: a.queue,
            time_limit: std::time::Duration::from_secs_f64(a.timeout),
            max_steps: a.max_steps,
            max_images: a.max_images,
        },
        ip: a.listen_ip,
        port: a.listen_port,
        api_key,
        max_body: usize::try_from(max_body).unwrap_or(usize::MAX),
        max_connections: a.max_connections,
        header_timeout: std::time::Duration::from_secs_f64(a.header_timeout),
        body_timeout: std::time::Duration::from_secs_f64(a.body_timeout),
    })
}

/// Where `generate` and `bench` run their stages.
#[derive(clap::Args)]
struct DeviceArgs {
    /// Where the stages run: `cpu`, or `cuda` (the first NVIDIA GPU; needs a build with
    /// `--features cuda` and the NVIDIA driver). On the GPU, `bench` times each step to its end.
    #[arg(long = "device", default_value = "cpu", value_parser = ["cpu", "cuda"])]
    device: String,
    /// With `--device cuda`: a folder of PTX compiled ahead of time for the GPU's architecture
    /// (`ARCH/NAME.ptx`, as `scripts/test-cuda --compile-only` writes them under
    /// `target/cuda-ptx`), instead of the kernels the plan carries (`edgeplan compile --target
    /// cuda-smXX`); with neither, NVRTC (`libnvrtc.so`) compiles the kernels at start.
    #[arg(long = "cuda-ptx")]
    cuda_ptx: Option<PathBuf>,
    /// With `--device cuda`: `fast` (tensor cores in the denoiser of a plan with F16, BF16 or
    /// quantized matrices: F16/BF16 products with the activations rounded, F16 attention) or
    /// `exact` (the CPU's arithmetic for every product). Q8_0 products are the CPU's bits either
    /// way.
    #[arg(long = "cuda-math", default_value = "fast", value_parser = ["fast", "exact"])]
    cuda_math: String,
}

#[derive(clap::Args)]
struct BenchArgs {
    /// The plan file (from `edgeplan compile`).
    #[arg(long)]
    plan: PathBuf,
    /// Image width in pixels (default: the plan's only size).
    #[arg(short = 'W', long = "width", allow_negative_numbers = true)]
    width: Option<u32>,
    /// Image height in pixels (default: the plan's only size).
    #[arg(short = 'H', long = "height", allow_negative_numbers = true)]
    height: Option<u32>,
    /// Stage to time: all, t5, denoiser or vae.
    #[arg(long, default_value = "all")]
    stage: String,
    /// Denoiser evaluations (NFE) to time.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Worker threads (default: one per core).
    #[arg(
        short = 't',
        long = "threads",
        allow_negative_numbers = true,
        default_value_t = 0
    )]
    threads: usize,
    /// Kernel table: `best` or a label `edgerun generate -v` lists.
    #[arg(long = "kernels", default_value = "best")]
    kernels: String,
    #[command(flatten)]
    dev: DeviceArgs,
    /// The prompt the text encoder runs on.
    #[arg(
        short = 'p',
        long = "prompt",
        default_value = "a large red circle on a blue background",
        allow_hyphen_values = true
    )]
    prompt: String,
}

#[derive(clap::Args)]
struct GenArgs {
    /// The plan file (from `edgeplan compile`).
    #[arg(long)]
    plan: PathBuf,
    /// Refuse the plan unless it is signed (`edgeplan sign`) by this Ed25519 public key
    /// (a KEY.pub file from `edgeplan keygen`: 64 hex digits or 32 raw bytes).
    #[arg(long = "trusted-key")]
    trusted_key: Option<PathBuf>,
    /// The prompt.
    #[arg(
        short = 'p',
        long = "prompt",
        default_value = "",
        allow_hyphen_values = true
    )]
    prompt: String,
    /// The negative prompt.
    #[arg(
        short = 'n',
        long = "negative-prompt",
        default_value = "",
        allow_hyphen_values = true
    )]
    negative_prompt: String,
    /// Denoising steps.
    #[arg(long, default_value_t = 20, allow_hyphen_values = true, value_parser = whole_number)]
    steps: usize,
    /// Classifier-free guidance scale, 0 to 100 (≤ 1 disables guidance).
    #[arg(long = "cfg-scale", default_value_t = 4.5, allow_hyphen_values = true)]
    cfg_scale: f32,
    /// Sampler: dpm++2m (also dpmpp2m, dpm++, dpmpp), euler, euler_a, heun, dpm2, ddim, lcm or
    /// unipc (stable-diffusion.cpp's names, any case; heun and dpm2 call the denoiser 2·steps − 1 times; euler_a and lcm draw noise
    /// from the seed's generator at each step; ddim clamps x0 to [−1, 1] as diffusers' DDIM
    /// does, which costs PixArt-Σ images their colour). Default: the one the plan's scheduler config
    /// names (dpm++2m for PixArt's DPMSolverMultistepScheduler, lcm for a PixArt-LCM folder).
    #[arg(long = "sampling-method")]
    sampling_method: Option<String>,
    /// Sigma schedule: `discrete` or `karras` (diffusers' `use_karras_sigmas`, for dpm++2m,
    /// euler, heun and dpm2).
    /// Default: what the plan's scheduler config says.
    #[arg(long = "scheduler")]
    scheduler: Option<String>,
    /// Seed of the initial noise: 0 to 2^64 − 1, or −1 for a random seed (printed, and recorded
    /// in the PNG like any other).
    #[arg(
        short = 's',
        long = "seed",
        default_value = "42",
        allow_hyphen_values = true
    )]
    seed: String,
    /// The generator the seed feeds: `torch-cpu` (default; also `cpu`): torch's CPU generator
    /// as torch on x86-64 with AVX2 draws it, so `-s 42` gives diffusers' image for seed 42;
    /// `torch-cpu-default`: as torch builds without AVX2 kernels (e.g. aarch64) draw it;
    /// `edge`: this runtime's SplitMix64 noise (images of earlier versions).
    #[arg(long = "rng", default_value = "torch-cpu")]
    rng: String,
    /// Image width in pixels (default: the plan's only size).
    #[arg(short = 'W', long = "width", allow_negative_numbers = true)]
    width: Option<u32>,
    /// Image height in pixels (default: the plan's only size).
    #[arg(short = 'H', long = "height", allow_negative_numbers = true)]
    height: Option<u32>,
    /// Output PNG (the name must end in .png, or have no extension). With `-b N`, `%d` in the
    /// name is replaced by the image's number (1…N); without `%d`, `_1`…`_N` is added before
    /// the extension.
    #[arg(short = 'o', long = "output", default_value = "output.png")]
    output: PathBuf,
    /// Images to make, with seeds s, s+1, … (stable-diffusion.cpp's `-b`).
    #[arg(
        short = 'b',
        long = "batch-count",
        default_value_t = 1,
        allow_hyphen_values = true
    )]
    batch_count: i64,
    /// Worker threads (default: one per core).
    #[arg(
        short = 't',
        long = "threads",
        allow_negative_numbers = true,
        default_value_t = 0
    )]
    threads: usize,
    /// Kernel table: `best` (default: the fastest this CPU has) or one of the labels `-v`
    /// lists (`generic`, `avx2`, `avx512`, `avx512+vnni`, `avx512+vnni+bf16`,
    /// `avx512+vnni+bf16+amx`, `neon`, `neon+dotprod`, …). Every x86 table gives the generic
    /// table's bytes.
    #[arg(long = "kernels", default_value = "best")]
    kernels: String,
    /// Initial noise: safetensors with one f32 tensor `latents` [1, 4, H/8, W/8] (replaces the
    /// seeded noise; with --init-img, the noise added to the encoded image).
    #[arg(long = "init-latents")]
    init_latents: Option<PathBuf>,
    /// Image to image: start from this PNG (8-bit RGB, one of the plan's sizes; -W/-H default
    /// to its size). The plan must have a VAE encoder (the default of `edgeplan compile`).
    #[arg(short = 'i', long = "init-img")]
    init_img: Option<PathBuf>,
    /// Image to image: how much of the schedule runs, in (0, 1] (default 0.75): ⌊steps ·
    /// strength⌋ steps run from the image noised to that step's level; small values keep
    /// more of the image.
    #[arg(long = "strength", allow_negative_numbers = true)]
    strength: Option<f64>,
    /// Decoder of the image: `vae` (default; the pipeline's AutoencoderKL) or `tae` (the plan's
    /// tiny decoder, TAESD: fast, approximate; `edgeplan compile --taesd`).
    #[arg(long = "decoder", default_value = "vae")]
    decoder: String,
    /// Previews while sampling (stable-diffusion.cpp's `--preview`): `none` (default), `tae`
    /// (the plan's tiny decoder) or `vae`; written atomically to --preview-path.
    #[arg(long = "preview", default_value = "none")]
    preview: String,
    /// Where previews are written (a .png name; replaced at every preview; default
    /// preview.png in the working folder). Only with --preview.
    #[arg(long = "preview-path")]
    preview_path: Option<PathBuf>,
    /// A preview after every N-th step (and after the last; default 1). Only with --preview.
    #[arg(long = "preview-interval", allow_negative_numbers = true)]
    preview_interval: Option<usize>,
    /// Preview the noisy latents of the step instead of the denoiser's clean estimate. Only
    /// with --preview.
    #[arg(long = "preview-noisy")]
    preview_noisy: bool,
    /// Also write the final latents (before VAE decoding) as safetensors `latents` [1, 4, H/8, W/8]
    /// (the name must end in .safetensors, or have no extension).
    #[arg(long = "latents-out")]
    latents_out: Option<PathBuf>,
    /// Memory budget (e.g. `1.5G`, `800M`, bytes without a suffix): refuse, before allocating,
    /// a plan whose arena plus weights exceed it.
    #[arg(long = "max-ram", allow_hyphen_values = true)]
    max_ram: Option<String>,
    /// Folder for the spill file of exact VAE tiles whose plan holds the activations between
    /// GroupNorms in a file (default: the system's temporary folder). The file is unlinked as
    /// soon as it is created, so nothing is left behind.
    #[arg(long = "spill-dir")]
    spill_dir: Option<PathBuf>,
    #[command(flatten)]
    dev: DeviceArgs,
    /// Check every step's output for NaN and infinity and stop at the first, naming the stage,
    /// step and op (slower; on a GPU each output is copied back to look).
    #[arg(long = "check-finite")]
    check_finite: bool,
    /// No progress display.
    #[arg(long)]
    quiet: bool,
    /// Print timings and memory figures.
    #[arg(short = 'v', long)]
    verbose: bool,
}

/// The largest `|x|` [`read_latents`] accepts in initial noise.
const MAX_INIT_NOISE: f32 = 1000.0;

fn read_latents(path: &Path, shape: &[usize]) -> Result<Vec<f32>> {
    let bytes = read_file(path, "--init-latents")?;
    let what = format!("--init-latents {}", path.display());
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| {
        anyhow::anyhow!(
            "{what}: not a safetensors file ({e}); expected one f32 tensor `latents` {shape:?}"
        )
    })?;
    let t = st.tensor("latents").map_err(|_| {
        anyhow::anyhow!("{what}: no tensor named `latents` (expected f32 {shape:?})")
    })?;
    if let Some(other) = st.names().into_iter().find(|n| *n != "latents") {
        bail!("{what}: holds a tensor `{other}` beside `latents`; expected one f32 tensor `latents` {shape:?}");
    }
    if t.dtype() != safetensors::Dtype::F32 || t.shape() != shape {
        bail!(
            "{what}: tensor `latents` is {:?} {:?}, expected F32 {shape:?}",
            t.dtype(),
            t.shape()
        );
    }
    let v: Vec<f32> = t
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    // The noise replaces a standard normal draw (|x| > 10 has probability about 1e-23): values
    // far beyond that only give a saturated image. The first value that is not finite or out
    // of range is named.
    if let Some((i, x)) = v
        .iter()
        .enumerate()
        .find(|(_, x)| !x.is_finite() || x.abs() > MAX_INIT_NOISE)
    {
        let shown = if x.is_finite() {
            format!("{x:e}")
        } else {
            x.to_string()
        };
        bail!(
            "{what}: tensor `latents` holds {shown} at flat index {i}; initial noise is standard \
             normal: expected finite values within ±{MAX_INIT_NOISE}"
        );
    }
    Ok(v)
}

/// The name of image `i` of `n`: `%d` replaced by `i + 1`; without `%d`, `_{i + 1}` before
/// the extension when `n > 1`; the name itself for one image.
fn batch_name(path: &Path, i: usize, n: usize) -> PathBuf {
    let text = path.to_string_lossy();
    if text.contains("%d") {
        return PathBuf::from(text.replace("%d", &(i + 1).to_string()));
    }
    if n == 1 {
        return path.to_path_buf();
    }
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    let name = match path.extension() {
        Some(e) => format!("{stem}_{}.{}", i + 1, e.to_string_lossy()),
        None => format!("{stem}_{}", i + 1),
    };
    path.with_file_name(name)
}

/// Refuses an output name whose extension says another format than the one written: `-o
/// out.jpg` would be a PNG named like a JPEG. No extension is accepted.
fn check_extension(flag: &str, out: &Path, format: &str, ext: &str) -> Result<()> {
    match out.extension().map(|e| e.to_string_lossy()) {
        Some(e) if !e.eq_ignore_ascii_case(ext) => bail!(
            "{flag} {}: edgerun writes {format} here, not .{e}; name the file .{ext}",
            out.display()
        ),
        _ => Ok(()),
    }
}

fn write_latents(path: &Path, data: &[f32], shape: &[usize]) -> Result<()> {
    let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.to_vec(), &bytes)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    let out =
        safetensors::serialize([("latents", view)], None).map_err(|e| anyhow::anyhow!("{e}"))?;
    edge_runtime::image::write_atomic(path, &out)?;
    Ok(())
}

/// Resets this process's VmHWM to its current resident set (`/proc/self/clear_refs` ← 5,
/// Linux ≥ 4.0), so the next reading is the peak since now; a no-op elsewhere.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// The KiB figure of `field` (e.g. `VmHWM:`) in `/proc/self/status`; `None` off Linux.
fn status_kib(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// This process's peak resident set (`VmHWM`) in KiB.
fn peak_rss_kib() -> Option<u64> {
    status_kib("VmHWM:")
}

/// `RssAnon` of this process in KiB (anonymous memory: heap and arena, not the mapped plan).
fn anon_rss_kib() -> Option<u64> {
    status_kib("RssAnon:")
}

/// The largest [`anon_rss_kib`] seen while `f` runs, sampled every 5 ms by a second thread
/// (the kernel keeps no peak of anonymous memory; a peak shorter than 5 ms can be missed).
fn with_anon_peak<T>(f: impl FnOnce() -> T) -> (T, u64) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let peak = AtomicU64::new(anon_rss_kib().unwrap_or(0));
    let done = AtomicBool::new(false);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(anon_rss_kib().unwrap_or(0), Ordering::Relaxed);
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        });
        let v = f();
        peak.fetch_max(anon_rss_kib().unwrap_or(0), Ordering::Relaxed);
        done.store(true, Ordering::Relaxed);
        (v, peak.load(Ordering::Relaxed))
    })
}

/// Starts the worker pool for `-t`: 0 means one thread per core; more than 4 per core (at
/// least 8) only slows the run down and is clamped with a warning; a pool the OS cannot start
/// is an error naming `-t`.
fn start_threads(requested: usize) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let max = (4 * cores).max(8);
    let n = if requested > max {
        say!(
            "warning: -t {requested}: this machine has {cores} cores, and more than {max} threads \
             (4 per core, at least 8) only slow the run; using {max}"
        );
        max
    } else {
        requested
    };
    edge_kernels::start_threads(n)
        .map_err(|e| anyhow::anyhow!("-t {requested}: could not start the worker threads: {e}"))
}

/// The plan size `-W`/`-H` name (either may be left out when only one size matches).
fn pick_size(
    meta: &edge_schema::plan::PlanMeta,
    w: Option<u32>,
    h: Option<u32>,
) -> Result<(u32, u32, &edge_schema::plan::ImageSize)> {
    let (width, height) = match (w, h, meta.sizes.as_slice()) {
        (Some(w), Some(h), _) => (w, h),
        (None, None, [only]) => (only.width, only.height),
        (w, h, sizes) => {
            let pick: Vec<_> = sizes
                .iter()
                .filter(|s| w.is_none_or(|w| w == s.width) && h.is_none_or(|h| h == s.height))
                .collect();
            match pick.as_slice() {
                [only] => (only.width, only.height),
                [] => bail!(
                    "-W/-H: no image size of the plan matches{}{}; the plan holds {}",
                    w.map_or(String::new(), |w| format!(" width {w}")),
                    h.map_or(String::new(), |h| format!(" height {h}")),
                    available_sizes(meta)
                ),
                _ => bail!(
                    "-W/-H: give the image size; the plan holds {}",
                    available_sizes(meta)
                ),
            }
        }
    };
    let size = meta.size(width, height).ok_or_else(|| {
        anyhow::anyhow!(
            "-W/-H: the plan has no size {width}x{height} (WxH); it holds {}",
            available_sizes(meta)
        )
    })?;
    Ok((width, height, size))
}

/// The kernel table `--kernels` names (`best` or a label of `edge_kernels_cpu::variants`).
/// The executor `--device` names: the CPU `session` itself, or a CUDA executor around it.
fn open_executor<'p>(
    session: Session<'p>,
    dev: &DeviceArgs,
    verbose: bool,
) -> Result<Box<dyn Executor<'p> + 'p>> {
    let (device, ptx) = (dev.device.as_str(), dev.cuda_ptx.as_deref());
    let fast = match dev.cuda_math.as_str() {
        "fast" => true,
        "exact" => false,
        other => bail!("--cuda-math {other}: expected fast or exact"),
    };
    match device {
        "cpu" => Ok(Box::new(session)),
        "cuda" => open_cuda(session, ptx, fast, verbose),
        other => bail!("--device {other}: expected cpu or cuda"),
    }
}

#[cfg(feature = "cuda")]
fn open_cuda<'p>(
    session: Session<'p>,
    ptx: Option<&Path>,
    fast: bool,
    verbose: bool,
) -> Result<Box<dyn Executor<'p> + 'p>> {
    use edge_kernels_cuda::gpu::Gpu;
    let modules = session.plan().meta().cuda.clone();
    // The plan's kernels (compiled by edgeplan for its --target) unless --cuda-ptx names
    // others; NVRTC at start only for a plan without kernels.
    let (gpu, from) = match (ptx, &modules) {
        (Some(dir), _) => (
            Gpu::open_with(&|s, arch| {
                edge_kernels_cuda::ptx_from_dir(dir, s, arch).map_err(|e| format!("--cuda-ptx {e}"))
            }),
            format!("PTX compiled ahead of time in {}", dir.display()),
        ),
        (None, Some(m)) => (
            Gpu::open_with(&|s, arch| edge_kernels_cuda::plan_ptx(m, s, arch)),
            format!("the plan ({} for {})", m.compiler, m.arch),
        ),
        (None, None) => (
            Gpu::open(),
            "NVRTC at start (the plan has none)".to_string(),
        ),
    };
    let gpu = gpu.map_err(|e| anyhow::anyhow!("--device cuda: {e}"))?;
    let mut cuda = edge_runtime::cuda::CudaSession::new(session, gpu)?;
    use edge_runtime::cuda::CudaMath;
    cuda.set_math(if fast {
        CudaMath::Fast
    } else {
        CudaMath::Exact
    });
    if verbose {
        say!(
            "device {} ({} math): kernels from {}",
            cuda.device(),
            if fast { "fast" } else { "exact" },
            from
        );
    }
    Ok(Box::new(cuda))
}

#[cfg(not(feature = "cuda"))]
fn open_cuda<'p>(
    _session: Session<'p>,
    _ptx: Option<&Path>,
    _fast: bool,
    _verbose: bool,
) -> Result<Box<dyn Executor<'p> + 'p>> {
    bail!("--device cuda: this edgerun was built without CUDA (build it with `cargo build --release -p edge-tools --features cuda`)")
}

fn pick_kernels(label: &str) -> Result<(&'static str, edge_kernels::KernelTable)> {
    if label == "best" {
        return Ok(edge_kernels_cpu::best_labelled());
    }
    let variants = edge_kernels_cpu::variants();
    match variants.iter().find(|(l, _)| *l == label) {
        Some(&v) => Ok(v),
        None if edge_kernels_cpu::TABLE_LABELS.contains(&label) => bail!(
            "--kernels {label:?}: this CPU ({}) cannot run that kernel table{}; it has {}",
            edge_kernels_cpu::features().summary(),
            arch_reason(label),
            table_labels()
        ),
        None => bail!(
            "--kernels {label:?}: unknown kernel table; {}expected best or one of {} (this CPU \
             has {})",
            common::did_you_mean(label, edge_kernels_cpu::TABLE_LABELS)
                .map(|n| format!("did you mean `{n}`? "))
                .unwrap_or_default(),
            edge_kernels_cpu::TABLE_LABELS.join(", "),
            table_labels()
        ),
    }
}

/// The labels of this CPU's kernel tables, comma-separated, after `best` and what it picks.
fn table_labels() -> String {
    let labels: Vec<&str> = edge_kernels_cpu::variants()
        .iter()
        .map(|(l, _)| *l)
        .collect();
    format!(
        "best (= {}), {}",
        edge_kernels_cpu::best_labelled().0,
        labels.join(", ")
    )
}

/// Why this CPU lacks the known kernel table `label`, when the reason is its architecture.
/// The kernel table whose quantized matmuls run on AMX tiles (`edgerun bench` rates them against
/// the AMX peak).
const AMX_TABLE: &str = "avx512+vnni+bf16+amx";

fn arch_reason(label: &str) -> &'static str {
    match (label.starts_with("neon"), cfg!(target_arch = "aarch64")) {
        (true, false) => " (NEON tables need an aarch64 CPU)",
        (false, true) if label != "generic" => " (AVX tables need an x86-64 CPU)",
        _ => "",
    }
}

/// A count given on the command line: a whole number (the range is checked after parsing).
fn whole_number(s: &str) -> std::result::Result<usize, String> {
    s.parse()
        .map_err(|_| "expected a whole number of at least 1".to_string())
}

/// The seed `-s` names: a whole number, or a fresh random one for `-1` (stable-diffusion.cpp's
/// spelling).
fn pick_seed(s: &str) -> Result<(u64, bool)> {
    if s.trim() == "-1" {
        let mut b = [0u8; 8];
        getrandom::fill(&mut b)
            .map_err(|e| anyhow::anyhow!("-s -1: no random seed from the OS: {e}"))?;
        return Ok((u64::from_le_bytes(b), true));
    }
    s.trim().parse::<u64>().map(|v| (v, false)).map_err(|_| {
        anyhow::anyhow!("-s/--seed {s}: expected a whole number from 0 to 18446744073709551615, or -1 for a random seed")
    })
}

fn generate(a: GenArgs) -> Result<()> {
    let t0 = Instant::now();
    let method: Option<SamplingMethod> = a
        .sampling_method
        .as_deref()
        .map(str::parse)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--sampling-method: {e}"))?;
    if a.steps == 0 {
        bail!("--steps: must be at least 1");
    }
    let karras = match a
        .scheduler
        .as_deref()
        .map(|s| s.trim().to_ascii_lowercase())
    {
        None => None,
        Some(s) if s == "karras" => Some(true),
        Some(s) if s == "discrete" => Some(false),
        Some(s) => bail!("--scheduler {s}: expected discrete or karras"),
    };
    let (seed, random_seed) = pick_seed(&a.seed)?;
    let rng: edge_runtime::rng::NoiseRng =
        a.rng.parse().map_err(|e| anyhow::anyhow!("--rng: {e}"))?;
    if a.prompt.is_empty() && !a.quiet {
        say!("note: no -p/--prompt: generating from the empty prompt (an unconditional image)");
    }
    if random_seed && !a.quiet {
        say!("seed: {seed} (random)");
    }
    let mut inputs: Vec<(&str, &Path)> = vec![("--plan", a.plan.as_path())];
    if let Some(p) = &a.init_latents {
        inputs.push(("--init-latents", p));
    }
    if let Some(p) = &a.trusted_key {
        inputs.push(("--trusted-key", p));
    }
    if let Some(p) = &a.init_img {
        inputs.push(("-i/--init-img", p));
    }
    let parse_decoder =
        |s: &str, flag: &str, none: bool| -> Result<Option<edge_runtime::Decoder>> {
            match s.trim().to_ascii_lowercase().as_str() {
                "vae" => Ok(Some(edge_runtime::Decoder::Vae)),
                "tae" | "taesd" => Ok(Some(edge_runtime::Decoder::Tiny)),
                "none" if none => Ok(None),
                other => bail!(
                    "{flag} {other}: expected {}vae or tae",
                    if none { "none, " } else { "" }
                ),
            }
        };
    let decoder = parse_decoder(&a.decoder, "--decoder", false)?.unwrap_or_default();
    let preview_path = a
        .preview_path
        .clone()
        .unwrap_or_else(|| PathBuf::from("preview.png"));
    let preview = match parse_decoder(&a.preview, "--preview", true)? {
        None => {
            // The preview options are not ignored silently without a preview.
            let given = [
                ("--preview-path", a.preview_path.is_some()),
                ("--preview-interval", a.preview_interval.is_some()),
                ("--preview-noisy", a.preview_noisy),
            ];
            if let Some((flag, _)) = given.iter().find(|(_, g)| *g) {
                bail!("{flag} applies to previews only: give --preview tae|vae");
            }
            None
        }
        Some(d) => {
            let interval = a.preview_interval.unwrap_or(1);
            if interval == 0 {
                bail!("--preview-interval 0: expected at least 1");
            }
            check_output_file("--preview-path", &preview_path)?;
            check_extension("--preview-path", &preview_path, "PNG", "png")?;
            Some(edge_runtime::PreviewSpec {
                decoder: d,
                interval,
                noisy: a.preview_noisy,
            })
        }
    };
    if a.strength.is_some() && a.init_img.is_none() {
        bail!("--strength applies to image to image only: give -i/--init-img IMAGE.png");
    }
    let strength = a.strength.unwrap_or(0.75);
    if !(strength > 0.0 && strength <= 1.0) {
        bail!("--strength {strength}: expected a number in (0, 1] (0.75 by default)");
    }
    // The init image is read (and refused) before any plan is opened.
    let init_rgb = match &a.init_img {
        Some(p) => {
            let bytes = common::read_file(p, "-i/--init-img")?;
            Some(edge_runtime::image::decode_png_rgb(
                &bytes,
                &p.display().to_string(),
            )?)
        }
        None => None,
    };
    if !(1..=1000).contains(&a.batch_count) {
        bail!("-b/--batch-count {}: expected 1 to 1000", a.batch_count);
    }
    // The server's bound (`serve`, `cfg_scale` from 0 to 100): a negative scale would only
    // turn guidance off, as any scale up to 1 does, so it is more likely a slip than a wish.
    if !(0.0..=100.0).contains(&a.cfg_scale) {
        bail!(
            "--cfg-scale {}: expected a number from 0 to 100 (PixArt uses 4.5; ≤ 1 disables guidance)",
            a.cfg_scale
        );
    }
    if a.batch_count > 1 && a.init_latents.is_some() {
        bail!("-b {} with --init-latents: the file gives one noise, every image would start from it; give one image per file", a.batch_count);
    }
    check_output_file("-o", &a.output)?;
    if let Some(p) = &a.latents_out {
        check_output_file("--latents-out", p)?;
    }
    let count = a.batch_count as usize;
    let pngs: Vec<PathBuf> = (0..count)
        .map(|i| batch_name(&a.output, i, count))
        .collect();
    let latent_files: Vec<PathBuf> = a
        .latents_out
        .iter()
        .flat_map(|p| (0..count).map(move |i| batch_name(p, i, count)))
        .collect();
    let mut outputs: Vec<(&str, &Path)> = pngs.iter().map(|p| ("-o", p.as_path())).collect();
    outputs.extend(latent_files.iter().map(|p| ("--latents-out", p.as_path())));
    if preview.is_some() {
        outputs.push(("--preview-path", preview_path.as_path()));
    }
    refuse_clobber(&inputs, &outputs)?;
    check_extension("-o", &a.output, "PNG", "png")?;
    if let Some(p) = &a.latents_out {
        check_extension("--latents-out", p, "safetensors", "safetensors")?;
    }
    for (flag, out) in &outputs {
        check_output_dir(flag, out)?;
        check_output_file(flag, out)?;
    }
    start_threads(a.threads)?;
    let plan = match &a.trusted_key {
        Some(k) => {
            let key = edge_runtime::TrustedKey::from_file(k)?;
            Plan::open_signed(&a.plan, &key).context("--plan")?
        }
        None => Plan::open(&a.plan).context("--plan")?,
    };
    let meta = plan.meta();
    edge_runtime::target::check(&meta.target)
        .with_context(|| format!("plan {}", a.plan.display()))?;
    let (width, height, size) = match &init_rgb {
        Some((iw, ih, _)) => {
            let p = a.init_img.as_deref().unwrap_or(Path::new("")).display();
            if a.width.is_some_and(|w| w != *iw) || a.height.is_some_and(|h| h != *ih) {
                bail!(
                    "-i/--init-img {p} is {iw}x{ih} but -W/-H ask for {}x{}; resize the image or drop -W/-H",
                    a.width.unwrap_or(*iw),
                    a.height.unwrap_or(*ih)
                );
            }
            let size = meta.size(*iw, *ih).ok_or_else(|| {
                anyhow::anyhow!(
                    "-i/--init-img {p} is {iw}x{ih} (WxH), not one of the plan's sizes: {}; resize it to one of them",
                    available_sizes(meta)
                )
            })?;
            if size.encoder_stage.is_none() {
                bail!(
                    "-i/--init-img: plan {} has no VAE encoder for {iw}x{ih} (compiled with --no-vae-encoder, or the encoder did not fit its --max-ram; `edgeplan inspect` lists the sizes it encodes)",
                    a.plan.display()
                );
            }
            (*iw, *ih, size)
        }
        None => pick_size(meta, a.width, a.height)?,
    };
    let method = method.unwrap_or(SamplingMethod::for_class(meta.scheduler.class));
    let karras_used = karras.unwrap_or(meta.scheduler.use_karras_sigmas);
    if karras_used && !method.supports_karras() {
        bail!(
            "--scheduler karras: karras sigmas are implemented for --sampling-method dpm++2m, euler, heun and dpm2, not {method}{}",
            if karras.is_none() { " (the plan's scheduler config asks for them; give --scheduler discrete)" } else { "" }
        );
    }
    if init_rgb.is_some() {
        edge_runtime::sampler::img2img_begin(a.steps, strength, method)?;
    }
    let den = &meta.stages[size.denoiser_stage as usize];
    let lshape: Vec<usize> = std::iter::once(1)
        .chain(
            den.values[den.inputs[0] as usize]
                .shape
                .iter()
                .map(|&d| d as usize),
        )
        .collect();
    let init_latents = a
        .init_latents
        .as_deref()
        .map(|p| read_latents(p, &lshape))
        .transpose()?;
    let weights: u64 = meta.tensors.iter().map(|t| t.len).sum();
    let arena = edge_runtime::session::arena_bytes(&plan);
    let charges = edge_schema::memory::tensor_charges(&meta.stages, &meta.tensors);
    let max_ram = a
        .max_ram
        .as_deref()
        .map(|s| parse_size(s, "--max-ram"))
        .transpose()?;
    // The error names the budget and its source (--max-ram or the plan's own).
    let rb = edge_runtime::budget::resolve(meta, &[size], max_ram)
        .with_context(|| format!("plan {}", a.plan.display()))?;
    let (budget, rss_start) = (rb.session, rb.rss_start);
    let peaks = edge_schema::memory::stage_peaks(meta, &meta.tensors, &charges, size, budget);
    let (table_label, kernels) = pick_kernels(&a.kernels)?;
    let pairs = meta
        .tensors
        .iter()
        .any(|t| t.layout == PackLayout::Bf16Pairs16);
    if pairs
        && table_label != "generic"
        && edge_kernels_cpu::linear_variant_name(&kernels, DType::BF16, PackLayout::Bf16Pairs16)
            == "generic_linear_bf16_pairs"
    {
        let what = "this plan's bf16 products (BF16 weights in pairs, --target \
                    x86_64-avx512bf16) run the generic kernel, tens of times slower (the same bits)";
        if a.kernels == "best" {
            eprintln!("warning: this CPU has no vdpbf16ps (AVX512_BF16): {what}");
        } else {
            eprintln!(
                "warning: --kernels {table_label} has no vdpbf16ps kernel: {what}; --kernels \
                 best picks the fastest table this CPU has"
            );
        }
    }
    let a7 = meta
        .tensors
        .iter()
        .any(|t| t.layout == PackLayout::Interleaved8x4A7);
    if a7
        && edge_kernels_cpu::linear_variant_name(
            &kernels,
            DType::Q8_0,
            PackLayout::Interleaved8x4A7,
        ) == "generic_linear_f32"
    {
        eprintln!(
            "warning: the {table_label} table has no fast kernel for this plan's 7-bit \
             activations (edgeplan compile --activation-bits 7): the generic kernel runs them, \
             many times slower (the same bits); they are for x86-64 CPUs with AVX2{}",
            if a.kernels == "best" {
                ""
            } else {
                "; --kernels best picks the fastest table this CPU has"
            }
        );
    }
    if a.verbose {
        let names: Vec<String> = kernels
            .names()
            .iter()
            .filter(|(slot, _)| !slot.ends_with("_scratch_bytes"))
            .map(|(slot, name)| format!("{slot}={name}"))
            .collect();
        say!(
            "kernels {table_label} on {} threads (tables: {}; cpu: {}): {}",
            rayon::current_num_threads(),
            table_labels(),
            edge_kernels_cpu::features().summary(),
            names.join(" ")
        );
        let mut packs: Vec<(DType, PackLayout)> = Vec::new();
        for t in &meta.tensors {
            if t.shape.len() == 2 && !packs.contains(&(t.dtype, t.layout)) {
                packs.push((t.dtype, t.layout));
            }
        }
        let per_pack: Vec<String> = packs
            .iter()
            .map(|&(d, l)| {
                let name = edge_kernels_cpu::linear_variant_name(&kernels, d, l);
                // F16 / BF16 weights that an f32 kernel reads are widened exactly, panel by
                // panel (f32 products), which the kernel's name alone does not say.
                let widened = matches!(d, DType::F16 | DType::BF16) && name.contains("_f32");
                format!(
                    "{}{} -> {name}{}",
                    d.name(),
                    match l {
                        PackLayout::RowMajor => "",
                        PackLayout::Interleaved4x8 => " (interleaved 4x8)",
                        PackLayout::Interleaved16x4 => " (interleaved 16x4)",
                        PackLayout::Bf16Pairs16 => " (pairs 16x2)",
                        PackLayout::Interleaved8x4A7 => " (interleaved 8x4, 7-bit activations)",
                    },
                    if widened {
                        " (widened to f32 panels)"
                    } else {
                        ""
                    }
                )
            })
            .collect();
        say!("matrix kernels: {}", per_pack.join(", "));
    }
    let session =
        edge_runtime::budget::open_session(&plan, kernels, &rb, a.spill_dir.clone(), &[size])?;
    let mut exec = open_executor(session, &a.dev, a.verbose)?;
    exec.set_check_finite(a.check_finite);
    let mut timings: HashMap<&str, f64> = HashMap::new();
    // With -v, the resident-set peak of each phase (VmHWM reset at each phase's start).
    let mut phase_peak: HashMap<&str, u64> = HashMap::new();
    let mut last_out = None;
    for i in 0..count {
        let seed = seed.wrapping_add(i as u64);
        let output = &pngs[i];
        if count > 1 && !a.quiet {
            say!("image {}/{count} (seed {seed})", i + 1);
        }
        let params = GenerateParams {
            prompt: a.prompt.clone(),
            negative_prompt: a.negative_prompt.clone(),
            steps: a.steps,
            cfg_scale: a.cfg_scale,
            method,
            seed,
            width,
            height,
            rng,
            karras,
            init_latents: init_latents.clone(),
            init_image: init_rgb
                .as_ref()
                .map(|(_, _, rgb)| edge_runtime::InitImage {
                    rgb: rgb.clone(),
                    strength,
                }),
            decoder,
            preview,
        };
        // A bar on a terminal; plain lines otherwise (logs, systemd), so progress is never silent.
        let lines = !a.quiet && !std::io::stderr().is_terminal();
        let bar = ProgressBar::new(a.steps as u64);
        if a.quiet || lines {
            bar.set_draw_target(ProgressDrawTarget::hidden());
        } else {
            bar.set_style(
                ProgressStyle::with_template("{msg:>10} [{bar:30}] {pos}/{len} {elapsed_precise}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar.set_message("encoding");
        }
        timings.clear();
        let mut phase_end = |name: &'static str| {
            if a.verbose {
                phase_peak.insert(name, peak_rss_kib().unwrap_or(0));
                reset_peak_rss();
            }
        };
        if a.verbose {
            reset_peak_rss();
        }
        let mut last = Instant::now();
        let preview_path = preview_path.clone();
        let mut on_preview = |p: edge_runtime::Preview<'_>| {
            edge_runtime::image::write_png(
                &preview_path,
                p.rgb,
                width,
                height,
                &[("preview", format!("step {}/{}", p.step, p.total))],
            )
        };
        let out = edge_runtime::generate_previewing(
            exec.as_mut(),
            &params,
            &mut |p| {
                let now = Instant::now();
                let dt = (now - last).as_secs_f64();
                last = now;
                match p {
                    Progress::Encoded => {
                        phase_end("encode");
                        timings.insert("encode", dt);
                        bar.set_message("sampling");
                        if lines {
                            say!("encoded the prompt in {dt:.2}s");
                        }
                    }
                    Progress::ImageEncoded => {
                        phase_end("encode image");
                        timings.insert("encode image", dt);
                        if lines {
                            say!("encoded the init image in {dt:.2}s");
                        }
                    }
                    Progress::Step { done, total } => {
                        bar.set_length(total as u64);
                        if done == total {
                            phase_end("sample");
                        }
                        *timings.entry("sample").or_default() += dt;
                        bar.set_position(done as u64);
                        if lines {
                            say!("step {done}/{total} in {dt:.2}s");
                        }
                    }
                    Progress::Decoded => {
                        phase_end("decode");
                        timings.insert("decode", dt);
                        bar.set_message("decoded");
                        if lines {
                            say!("decoded the latents in {dt:.2}s");
                        }
                    }
                }
                edge_runtime::Flow::Continue
            },
            &mut on_preview,
        )?;
        bar.finish_and_clear();
        if out.truncated {
            say!(
                "warning: the prompt or the negative prompt was longer than the plan's {} tokens and was truncated",
                meta.text.max_sequence_length
            );
        }
        if let Some(p) = latent_files.get(i) {
            write_latents(p, &out.latents, &lshape)?;
        }
        let plan_name = a
            .plan
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        let digest = edge_schema::header::encode_hex(&plan.digest());
        let fields = edge_runtime::parameters::GenerationInfo {
            prompt: a.prompt.clone(),
            negative_prompt: a.negative_prompt.clone(),
            steps: a.steps,
            sampler: method,
            cfg_scale: a.cfg_scale,
            seed,
            rng,
            karras: karras_used,
            width,
            height,
            model: meta.model.name.clone(),
            plan_name,
            plan_digest: digest,
            init_latents: a
                .init_latents
                .as_ref()
                .and_then(|p| p.file_name())
                .map(|n| n.to_string_lossy().to_string()),
            init_image: a.init_img.as_ref().map(|p| {
                (
                    p.file_name()
                        .map(|n| n.to_string_lossy().to_string())
                        .unwrap_or_default(),
                    strength,
                )
            }),
        };
        if let Err(e) =
            edge_runtime::image::write_png(output, &out.rgb, width, height, &fields.png_text())
        {
            // The image and its latents are one result: no latents file without its PNG.
            if let Some(p) = latent_files.get(i) {
                let _ = std::fs::remove_file(p);
            }
            return Err(e.into());
        }
        if !a.quiet {
            say!(
                "wrote {} ({width}x{height}) in {:.2}s",
                output.display(),
                t0.elapsed().as_secs_f64()
            );
        }
        last_out = Some(out);
    }
    let Some(out) = last_out else {
        return Ok(());
    };
    if a.verbose {
        let per_step: Vec<String> = out
            .streamed_per_step
            .iter()
            .map(|b| b.to_string())
            .collect();
        say!(
            "timings: encode {:.3}s,{} sampling {:.3}s, decode {:.3}s",
            timings.get("encode").unwrap_or(&0.0),
            timings
                .get("encode image")
                .map_or(String::new(), |t| format!(" encode image {t:.3}s,")),
            timings.get("sample").unwrap_or(&0.0),
            timings.get("decode").unwrap_or(&0.0),
        );
        if let Some(r) = &out.encoder_tiles {
            say!(
                "vae encode: exact tiles ({} windows x {} intervals, GroupNorm statistics of the whole image), {} bytes held between GroupNorms in {}, windows cover {:.2}x the latent's pixels",
                r.windows,
                r.intervals,
                r.held_bytes,
                if r.in_file { "a spill file" } else { "memory" },
                r.work_factor
            );
        }
        let decode_secs = timings.get("decode").copied().unwrap_or(0.0);
        if let Some(edge_runtime::tiling::TileReport::Exact(r)) = &out.tiles {
            say!(
                "vae decode: exact tiles ({} windows x {} intervals, GroupNorm statistics of the whole image), {} bytes held between GroupNorms in {}, windows cover {:.2}x the image's pixels (decode {decode_secs:.3}s; the whole-image decode's work at this rate: about {:.3}s)",
                r.windows,
                r.intervals,
                r.held_bytes,
                if r.in_file { "a spill file" } else { "memory" },
                r.work_factor,
                decode_secs / r.work_factor.max(1.0)
            );
        } else if let Some(edge_runtime::tiling::TileReport::Estimate(r)) = &out.tiles {
            say!(
                "vae decode: estimated statistics ({} tiles blended, {} GroupNorms normalised with the statistics of a whole-image decode of the latent reduced to {}x{}, 1/{} per axis), {} bytes held for the estimate in memory, tiles cover {:.2}x the image's pixels (decode {decode_secs:.3}s, of which the estimate pass {:.3}s; the whole-image decode's work at this rate: about {:.3}s)",
                r.tiles,
                r.norms,
                r.reduced_w,
                r.reduced_h,
                r.factor,
                r.held_bytes,
                r.work_factor,
                r.estimate_secs,
                (decode_secs - r.estimate_secs).max(0.0) / r.work_factor.max(1.0)
            );
        } else if let Some(t) = meta
            .size(width, height)
            .and_then(|s| s.decoder_tiling.as_ref())
        {
            say!(
                "vae decode: blended tiles of {}x{} latent pixels (each normalised alone)",
                t.tile_latent_w,
                t.tile_latent_h
            );
        }
        say!(
            "memory: budget {}, arena {arena} bytes, weights {weights} bytes; weight bytes made resident per sampler step [{}] (a monolithic plan's at its first step, a segmented one's streamed each step); released {} bytes",
            budget.map_or("none".to_string(), |b| format!("{b} bytes")),
            per_step.join(", "),
            exec.streamer().released_bytes()
        );
        if let Some(d) = exec.device_summary() {
            say!("{d}");
        }
        let predicted = peaks.iter().map(|p| p.peak).max().unwrap_or(0);
        let measured = phase_peak.values().copied().max().unwrap_or(0);
        let top = peaks.iter().max_by_key(|p| p.peak);
        say!(
            "peak RSS (VmHWM) {measured} KiB; predicted peak {} KiB = {} KiB at start (process) + {} KiB host buffers + {} KiB arena + {} KiB resident weights (stage {})",
            (rss_start + predicted) / 1024,
            rss_start / 1024,
            top.map_or(0, |p| p.host) / 1024,
            top.map_or(0, |p| p.arena) / 1024,
            top.map_or(0, |p| p.peak - p.host - p.arena) / 1024,
            top.map_or("none".into(), |p| meta.stages[p.stage as usize].name.clone())
        );
        use edge_schema::plan::StageKind as K;
        for (phase, kinds) in [
            ("encode", &[K::TextEncoder, K::CrossKv][..]),
            (
                "encode image",
                &[K::VaeEncoder, K::VaeEncoderDown, K::VaeEncoderMid][..],
            ),
            ("sample", &[K::Denoiser][..]),
            (
                "decode",
                &[K::VaeDecoder, K::VaeDecoderHead, K::VaeDecoderTail][..],
            ),
        ] {
            if !phase_peak.contains_key(phase) && phase == "encode image" {
                continue;
            }
            let stages: Vec<String> = peaks
                .iter()
                .filter(|p| kinds.contains(&meta.stages[p.stage as usize].kind))
                .map(|p| {
                    format!(
                        "{} {} KiB (arena {}, weights {}, host {})",
                        meta.stages[p.stage as usize].name,
                        (rss_start + p.peak) / 1024,
                        p.arena / 1024,
                        (p.peak - p.host - p.arena) / 1024,
                        p.host / 1024
                    )
                })
                .collect();
            say!(
                "memory {phase}: measured peak {} KiB; predicted {}",
                phase_peak.get(phase).copied().unwrap_or(0),
                stages.join(", ")
            );
        }
    }
    Ok(())
}

/// Seconds of `f`.
fn timed<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, f64)> {
    let t = Instant::now();
    let v = f()?;
    Ok((v, t.elapsed().as_secs_f64()))
}

/// Bytes per second of summing a 64 MiB buffer on every thread at once (read bandwidth), or
/// `None` when the buffer cannot be allocated (a small device).
fn memory_bandwidth() -> Option<f64> {
    use rayon::prelude::*;
    let words = 8 << 20;
    let mut buf: Vec<u64> = Vec::new();
    buf.try_reserve_exact(words).ok()?;
    buf.resize(words, 1);
    let mut best = 0f64;
    for _ in 0..3 {
        let t = Instant::now();
        let s: u64 = buf.par_chunks(1 << 16).map(|c| c.iter().sum::<u64>()).sum();
        std::hint::black_box(s);
        best = best.max((buf.len() * 8) as f64 / t.elapsed().as_secs_f64());
    }
    Some(best)
}

fn bench(a: BenchArgs) -> Result<()> {
    use edge_schema::plan::StageKind;
    let which = a.stage.as_str();
    if !["all", "t5", "denoiser", "vae"].contains(&which) {
        bail!("--stage {which}: expected all, t5, denoiser or vae");
    }
    if a.reps == 0 {
        bail!("--reps: must be at least 1");
    }
    start_threads(a.threads)?;
    let threads = rayon::current_num_threads();
    let plan = Plan::open(&a.plan).context("--plan")?;
    let meta = plan.meta();
    edge_runtime::target::check(&meta.target)
        .with_context(|| format!("plan {}", a.plan.display()))?;
    let (width, height, size) = pick_size(meta, a.width, a.height)?;
    let (label, kernels) = pick_kernels(&a.kernels)?;
    if let Some(b) = meta.budget {
        eprintln!(
            "warning: bench times the ops without the plan's memory budget of {b} bytes (no \
             limit on what stays resident); edgerun generate -v measures a run within it"
        );
    }
    // The executor first: a missing GPU or driver fails before anything is printed or measured.
    let session = Session::new(&plan, kernels, None)?;
    let mut exec = open_executor(session, &a.dev, true)?;
    out!(
        "plan {} at {width}x{height}; kernels {label}; {threads} thread{}; cpu: {}",
        a.plan.display(),
        if threads == 1 { "" } else { "s" },
        edge_kernels_cpu::features().summary()
    );
    // Peaks measured in this run, per thread (run on one thread; the pool's threads are alike).
    // On a GPU the CPU's peaks say nothing of the steps' rates: "of peak" is left out there.
    let on_cpu = a.dev.device == "cpu";
    let pk = if on_cpu {
        edge_kernels_cpu::peak(20_000_000)
    } else {
        edge_kernels_cpu::Peak::default()
    };
    if on_cpu {
        let bw = memory_bandwidth();
        let fmt_peak =
            |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{:.1} GOP/s", v / 1e9));
        out!(
            "peak of one thread, measured now: f32 fused multiply-add {} (matmul, conv2d and \
             attention), f32 multiply then add {} (element-wise ops), int8 dot {}, bf16 dot {} \
             (bf16 products){}; memory read, all threads: {}",
            fmt_peak(pk.f32_fma_ops),
            fmt_peak(pk.f32_ops),
            fmt_peak(pk.int8_ops),
            fmt_peak(pk.bf16_ops),
            pk.amx_int8_ops.map_or(String::new(), |v| format!(
                ", AMX int8 tile {} (quantized matmuls of the {AMX_TABLE} table)",
                fmt_peak(Some(v))
            )),
            bw.map_or("n/a".to_string(), |b| format!("{:.1} GB/s", b / 1e9))
        );
        out!("(\"of peak\" below = achieved rate / (one thread's peak × {threads} threads))");
    } else {
        out!("(rates below are the GPU's, each step timed to its end; no GPU peak is measured here: scripts/bench-gpu measures PyTorch's beside)");
    }
    let s = exec.as_mut();
    s.set_profiling(true);
    let tok = edge_runtime::tokenizer::Tokenizer::new(&meta.tokenizer)?;
    let run_t5 = which == "all" || which == "t5";
    let ((hidden, mask, _), t5_s) =
        timed(|| Ok(edge_runtime::pipeline::encode_text(s, &tok, &a.prompt)?))?;
    let (mut cond, kv_s) = timed(|| Ok(edge_runtime::pipeline::condition(s, hidden, mask)?))?;
    // The NFE figures and the op table keep every context token, as the peers' all-ones mask
    // does (`scripts/bench-peers`): the cross-attention then visits all of them. The prompt's
    // own mask (its padding dropped) is timed after them.
    let all_kept = vec![1.0; cond.mask.len()];
    let prompt_mask = std::mem::replace(&mut cond.mask, all_kept);
    if run_t5 {
        // Again, as every later prompt of this process runs (a server's): the first encode
        // also checked its sections' digests and mapped their pages. Not in the op table.
        let kept = s.replace_profile(None);
        let (_, again_s) = timed(|| Ok(edge_runtime::pipeline::encode_text(s, &tok, &a.prompt)?))?;
        s.replace_profile(kept);
        out!(
            "t5 encode (one prompt): {t5_s:.3} s (first in this process, with the sections' \
             digests and page mapping), again {again_s:.3} s; cross-attention K/V: {kv_s:.3} s \
             (the op tables below are of the first encode)"
        );
    }
    let den = &meta.stages[size.denoiser_stage as usize];
    let n = den.values[den.inputs[0] as usize]
        .shape
        .iter()
        .product::<u64>() as usize;
    let latent: Vec<f32> = (0..n)
        .map(|i| ((i * 7919 % 2001) as f32 / 1000.0) - 1.0)
        .collect();
    let mut eps = vec![0f32; n];
    if which == "denoiser" || which == "vae" {
        // The prompt's encode above was set-up, not the stage asked for.
        s.set_profiling(true);
    }
    if which == "all" || which == "denoiser" {
        if a.dev.device != "cpu" {
            // A GPU uploads each weight on first use: one evaluation outside the figures.
            let kept = s.replace_profile(None);
            edge_runtime::pipeline::denoise(s, size, &latent, 500.0, &cond, &mut eps)?;
            s.replace_profile(kept);
        }
        // `reps` NFEs with `cond`: their times, sorted.
        let mut nfes = |s: &mut dyn Executor<'_>, cond: &edge_runtime::pipeline::Condition| {
            let mut times = Vec::new();
            for _ in 0..a.reps {
                let ((), t) = timed(|| {
                    Ok(edge_runtime::pipeline::denoise(
                        s, size, &latent, 500.0, cond, &mut eps,
                    )?)
                })?;
                times.push(t);
            }
            times.sort_by(f64::total_cmp);
            Ok::<_, anyhow::Error>(times)
        };
        let times = nfes(s, &cond)?;
        out!(
            "denoiser NFE ({} run{}, all {} context tokens kept): median {:.3} s, min {:.3} s",
            a.reps,
            if a.reps == 1 { "" } else { "s" },
            cond.mask.len(),
            times[times.len() / 2],
            times[0]
        );
        let kept = prompt_mask.iter().filter(|&&m| m != 0.0).count();
        if on_cpu && kept < prompt_mask.len() {
            let l = prompt_mask.len();
            cond.mask = prompt_mask;
            let prof = s.replace_profile(None);
            let times = nfes(s, &cond)?;
            s.replace_profile(prof);
            out!(
                "denoiser NFE with the prompt's mask ({kept} of {l} context tokens kept; the \
                 cross-attention skips the padding after them; not in the op table): median \
                 {:.3} s, min {:.3} s",
                times[times.len() / 2],
                times[0]
            );
        }
    }
    if which == "all" || which == "vae" {
        let lat: Vec<f32> = latent.iter().map(|v| v * 0.5).collect();
        let before = anon_rss_kib().unwrap_or(0);
        let (r, peak) =
            with_anon_peak(|| timed(|| Ok(edge_runtime::pipeline::decode_latents(s, size, &lat)?)));
        let (_, t) = r?;
        out!(
            "vae decode: {t:.3} s; anonymous memory (RssAnon, sampled every 5 ms) {} MiB before, peak {} MiB",
            before / 1024,
            peak / 1024
        );
    }
    let Some(prof) = s.profile() else {
        return Ok(());
    };
    for kind in [
        StageKind::TextEncoder,
        StageKind::CrossKv,
        StageKind::Denoiser,
        StageKind::VaeDecoder,
        StageKind::VaeDecoderHead,
        StageKind::VaeDecoderTail,
    ] {
        let rows: Vec<_> = prof.rows.iter().filter(|r| r.stage == kind).collect();
        if rows.is_empty() {
            continue;
        }
        let total: f64 = rows.iter().map(|r| r.time.as_secs_f64()).sum();
        // The denoiser's table sums its timed NFEs; every other stage ran once.
        let runs = if kind == StageKind::Denoiser && a.reps > 1 {
            format!("summed over the {} NFEs timed above", a.reps)
        } else if kind == StageKind::Denoiser {
            "the NFE timed above".to_string()
        } else {
            "one run".to_string()
        };
        out!("\n{kind:?}: {:.1} ms in ops ({runs})", total * 1e3);
        out!(
            "  {:<20} {:>7} {:>10} {:>7} {:>11} {:>9} {:>10}",
            "op",
            "calls",
            "time ms",
            "share",
            "GFLOP/s",
            "of peak",
            "GB/s out"
        );
        let mut rows = rows;
        rows.sort_by_key(|r| std::cmp::Reverse(r.time));
        for r in rows {
            let t = r.time.as_secs_f64();
            let rate = r.flops / t;
            // Quantized matmuls run on the int8 dot peak, f32 matmuls, convolutions and
            // attention on the fused f32 one, element-wise ops on the unfused one.
            let peak = match r.weights {
                _ if r.bf16_products => pk.bf16_ops,
                Some(d) if d.is_quantized() && label == AMX_TABLE => {
                    pk.amx_int8_ops.or(pk.int8_ops)
                }
                Some(d) if d.is_quantized() => pk.int8_ops,
                // `linear` and the products with a fused epilogue (`linear+gelu_tanh`).
                _ if r.op.starts_with("linear")
                    || matches!(r.op, "conv2d" | "conv2d winograd" | "attention") =>
                {
                    pk.f32_fma_ops.or(pk.f32_ops)
                }
                _ => pk.f32_ops,
            };
            let of_peak = match (r.flops > 0.0, peak) {
                (true, Some(p)) => format!("{:.0}%", 100.0 * rate / (p * threads as f64)),
                _ => "-".into(),
            };
            let gflops = if r.flops > 0.0 {
                format!("{:.1}", rate / 1e9)
            } else {
                "-".into()
            };
            let name = match r.weights {
                Some(d) if r.bf16_products => format!("{} {} pairs", r.op, d.name()),
                Some(d) => format!("{} {}", r.op, d.name()),
                None if r.bf16_products => format!("{} bf16", r.op),
                None => r.op.to_string(),
            };
            // A rate over less than a millisecond in all says nothing (views such as `reshape`
            // and in-place `concat` copy nothing and showed thousands of GB/s).
            let gbs = if t >= 1e-3 {
                format!("{:.1}", r.bytes_out / t / 1e9)
            } else {
                "-".into()
            };
            out!(
                "  {:<20} {:>7} {:>10.1} {:>6.1}% {:>11} {:>9} {:>10}",
                name,
                r.calls,
                t * 1e3,
                100.0 * t / total,
                gflops,
                of_peak,
                gbs
            );
        }
    }
    Ok(())
}

fn main() {
    // Freed buffers go back to the system, so a run's resident set follows what is live.
    edge_runtime::alloc::return_large_frees();
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Generate(a) => generate(*a),
        Cmd::Bench(a) => bench(a),
        Cmd::Serve(a) => serve(a),
    };
    if let Err(e) = r {
        say!("error: {}", one_line(&e));
        std::process::exit(1);
    }
}
