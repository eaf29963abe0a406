//! The job queue: one worker thread owns the plan, its session and arena (opened, verified and
//! allocated once) and runs jobs one at a time in order of arrival, so memory stays inside the
//! budget under any load. Jobs wait in a bounded queue; a full queue refuses at once.
//!
//! Nothing here knows HTTP: a job is a [`JobSpec`] and a reply callback.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use edge_runtime::parameters::GenerationInfo;
use edge_runtime::{Flow, GenerateParams, Plan, Progress, Session};

use crate::request::{JobSpec, Limits};

/// How the worker opens the plan and bounds a job.
#[derive(Debug)]
pub struct WorkerConfig {
    /// The plan file.
    pub plan: PathBuf,
    /// Refuse the plan unless it is signed by this key.
    pub trusted_key: Option<edge_runtime::TrustedKey>,
    /// The kernel table every job runs on.
    pub kernels: edge_kernels::KernelTable,
    /// The process's memory budget in bytes: `--max-ram`, less what the HTTP side may hold
    /// ([`crate::serve`] takes it off).
    pub max_ram: Option<u64>,
    /// Folder of the exact VAE tiles' spill file (default: the system's temporary folder).
    pub spill_dir: Option<PathBuf>,
    /// Jobs waiting or running at most; one more is refused with [`JobError::Full`].
    pub queue: usize,
    /// A job still running after this long is stopped at its next step.
    pub time_limit: Duration,
    /// The most steps and images a request may ask for.
    pub max_steps: usize,
    pub max_images: usize,
}

/// What the plan offers, read once when the worker opened it.
#[derive(Clone, Debug)]
pub struct PlanInfo {
    /// The plan's file name.
    pub plan_name: String,
    /// The model's name from the plan's metadata.
    pub model: String,
    /// BLAKE3 digest of the plan's metadata, 64 hex digits.
    pub digest: String,
    /// What a request may ask for.
    pub limits: Limits,
    /// The process's budget in bytes, if any.
    pub budget: Option<u64>,
}

/// One image of a finished job.
#[derive(Clone, Debug)]
pub struct Image {
    /// The PNG file's bytes, with the same metadata as `edgerun generate` writes.
    pub png: Vec<u8>,
    pub seed: u64,
    /// The PNG's `parameters` text (AUTOMATIC1111 layout).
    pub infotext: String,
}

/// A finished job.
#[derive(Clone, Debug)]
pub struct Done {
    /// The job's number, in order of arrival from 1.
    pub job: u64,
    pub images: Vec<Image>,
    /// Time between arrival and start.
    pub queue_wait: Duration,
    /// Time from start to the last image.
    pub run_time: Duration,
    /// Whether a prompt was cut to the plan's maximum sequence length.
    pub truncated: bool,
}

/// Why a job gave no images.
#[derive(Clone, Debug, PartialEq)]
pub enum JobError {
    /// The queue holds its maximum of jobs.
    Full { queue: usize },
    /// The server is shutting down.
    ShuttingDown,
    /// An interrupt (`POST /sdapi/v1/interrupt`) stopped it.
    Interrupted { after: String },
    /// The client went away before the job ended.
    Gone,
    /// The server began shutting down while it ran.
    Stopped { after: String },
    /// It ran past the per-request time limit.
    TimedOut { limit: Duration, after: String },
    /// Sampling diverged (guidance scale far out of range).
    Diverged(String),
    /// The run failed (the plan changed under the server, an internal error).
    Failed(String),
}

impl std::fmt::Display for JobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobError::Full { queue } => write!(
                f,
                "the queue is full ({queue} jobs waiting or running); try again later"
            ),
            JobError::ShuttingDown => f.write_str("the server is shutting down; the job was not run"),
            JobError::Gone => f.write_str("the client closed the connection; the job was dropped"),
            JobError::Stopped { after } => write!(f, "the server is shutting down; the job was stopped after {after}; no image"),
            JobError::Interrupted { after } => write!(f, "interrupted (POST /sdapi/v1/interrupt) after {after}; no image"),
            JobError::TimedOut { limit, after } => write!(
                f,
                "the job ran past the server's per-request limit of {} s and was stopped after {after}; no image",
                limit.as_secs_f64()
            ),
            JobError::Diverged(m) | JobError::Failed(m) => f.write_str(m),
        }
    }
}

/// What the worker is doing, for `GET /sdapi/v1/progress`.
#[derive(Clone, Debug, Default)]
pub struct Status {
    /// The running job, if any.
    pub running: Option<Running>,
    /// Jobs waiting (not counting the running one).
    pub waiting: usize,
}

/// The running job.
#[derive(Clone, Debug)]
pub struct Running {
    pub job: u64,
    /// Image being made, from 0.
    pub image: usize,
    pub images: usize,
    /// Steps done of the current image.
    pub step: usize,
    pub steps: usize,
    /// Seconds since the job started.
    pub elapsed: f64,
    /// Fraction of the job done, 0 … 1 (encode, steps and decode of every image).
    pub progress: f64,
}

impl Running {
    /// Seconds left, from the rate so far; `None` before any progress.
    pub fn eta(&self) -> Option<f64> {
        (self.progress > 0.0).then(|| self.elapsed * (1.0 - self.progress) / self.progress)
    }
}

type Reply = Box<dyn FnOnce(Result<Done, JobError>) + Send>;

struct Job {
    number: u64,
    spec: JobSpec,
    arrived: Instant,
    /// Set when the client is gone: a waiting job is skipped, a running one stopped.
    gone: Arc<AtomicBool>,
    reply: Reply,
}

struct Progressing {
    job: u64,
    started: Instant,
    image: usize,
    images: usize,
    step: usize,
    steps: usize,
    /// Units done: per image, 1 for the encode, `steps`, 1 for the decode.
    units: usize,
}

struct Shared {
    pending: AtomicUsize,
    cap: usize,
    next: AtomicU64,
    interrupt: AtomicBool,
    closing: AtomicBool,
    running: Mutex<Option<Progressing>>,
}

impl Shared {
    fn running(&self) -> MutexGuard<'_, Option<Progressing>> {
        // A poisoned lock only means a panic while it was held; the value is still a status.
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The queue in front of the worker.
pub struct Queue {
    /// Behind a lock so that numbering and entering the channel are one step: job numbers
    /// are the run order.
    tx: Mutex<SyncSender<Job>>,
    shared: Arc<Shared>,
}

impl Queue {
    /// Starts the worker: it opens and verifies the plan, checks the budget and allocates the
    /// session once, then waits for jobs. Returns when the plan is ready.
    ///
    /// # Errors
    /// The plan cannot be opened or verified, is for another target, needs more than
    /// `max_ram`, or its spill folder is unusable.
    pub fn start(cfg: WorkerConfig) -> Result<(Queue, PlanInfo)> {
        let (tx, rx) = sync_channel::<Job>(cfg.queue.max(1));
        let shared = Arc::new(Shared {
            pending: AtomicUsize::new(0),
            cap: cfg.queue.max(1),
            next: AtomicU64::new(1),
            interrupt: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            running: Mutex::new(None),
        });
        let (ready_tx, ready_rx) = sync_channel::<Result<PlanInfo>>(1);
        let sh = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("edgerun-worker".into())
            .spawn(move || worker(cfg, rx, sh, ready_tx))
            .context("starting the worker thread")?;
        let info = ready_rx
            .recv()
            .context("the worker thread ended before opening the plan")??;
        Ok((
            Queue {
                tx: Mutex::new(tx),
                shared,
            },
            info,
        ))
    }

    /// Queues a job; `reply` is called once with its outcome (on the worker thread). Setting
    /// `gone` (the client went away) skips the job if it still waits and stops it at its next
    /// step if it runs. Returns the job's number.
    ///
    /// # Errors
    /// [`JobError::Full`] when [`WorkerConfig::queue`] jobs wait or run;
    /// [`JobError::ShuttingDown`] after [`Queue::close`].
    pub fn submit(
        &self,
        spec: JobSpec,
        gone: Arc<AtomicBool>,
        reply: impl FnOnce(Result<Done, JobError>) + Send + 'static,
    ) -> Result<u64, JobError> {
        if self.shared.closing.load(Ordering::SeqCst) {
            return Err(JobError::ShuttingDown);
        }
        let cap = self.shared.cap;
        if self
            .shared
            .pending
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |p| {
                (p < cap).then_some(p + 1)
            })
            .is_err()
        {
            return Err(JobError::Full { queue: cap });
        }
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        // Numbers are taken in the order jobs enter the channel, so they are the run order.
        let number = self.shared.next.fetch_add(1, Ordering::SeqCst);
        let job = Job {
            number,
            spec,
            arrived: Instant::now(),
            gone,
            reply: Box::new(reply),
        };
        match tx.try_send(job) {
            Ok(()) => Ok(number),
            Err(e) => {
                self.shared.pending.fetch_sub(1, Ordering::SeqCst);
                let job = match e {
                    std::sync::mpsc::TrySendError::Full(j)
                    | std::sync::mpsc::TrySendError::Disconnected(j) => j,
                };
                drop(job);
                Err(JobError::Full { queue: cap })
            }
        }
    }

    /// Jobs that may wait or run at once.
    pub fn capacity(&self) -> usize {
        self.shared.cap
    }

    /// Stops the running job at its next step (A1111's interrupt). Waiting jobs still run.
    pub fn interrupt(&self) {
        self.shared.interrupt.store(true, Ordering::SeqCst);
    }

    /// Refuses new jobs, stops the running one and answers the waiting ones with
    /// [`JobError::ShuttingDown`].
    pub fn close(&self) {
        self.shared.closing.store(true, Ordering::SeqCst);
        self.shared.interrupt.store(true, Ordering::SeqCst);
    }

    /// What the worker is doing now.
    pub fn status(&self) -> Status {
        let pending = self.shared.pending.load(Ordering::SeqCst);
        let running = self.shared.running().as_ref().map(|p| {
            let per_image = p.steps + 2;
            let total = (p.images * per_image).max(1);
            Running {
                job: p.job,
                image: p.image,
                images: p.images,
                step: p.step,
                steps: p.steps,
                elapsed: p.started.elapsed().as_secs_f64(),
                progress: (p.units as f64 / total as f64).min(1.0),
            }
        });
        Status {
            waiting: pending.saturating_sub(usize::from(running.is_some())),
            running,
        }
    }
}

/// Opens the plan and its session (the setup `edgerun generate` does, for every size).
fn open(cfg: &WorkerConfig) -> Result<Plan> {
    let plan = match &cfg.trusted_key {
        Some(k) => Plan::open_signed(&cfg.plan, k)?,
        None => Plan::open(&cfg.plan).context("--plan")?,
    };
    edge_runtime::target::check(&plan.meta().target)
        .with_context(|| format!("plan {}", cfg.plan.display()))?;
    // A server opens its plan once and runs it for days: every section's digest is checked
    // now, so a damaged plan is refused at start, not job by job (the error names the file).
    plan.verify_all_sections()?;
    Ok(plan)
}

fn worker(
    cfg: WorkerConfig,
    rx: Receiver<Job>,
    shared: Arc<Shared>,
    ready: SyncSender<Result<PlanInfo>>,
) {
    let plan = match open(&cfg) {
        Ok(p) => p,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let meta = plan.meta();
    let sizes: Vec<_> = meta.sizes.iter().collect();
    let setup = || -> Result<(Session<'_>, Option<u64>)> {
        // The error names the budget and its source (`--max-ram`, after the HTTP side's share
        // that `serve` took off, or the plan's own).
        let rb = edge_runtime::budget::resolve(meta, &sizes, cfg.max_ram)
            .with_context(|| format!("plan {}", cfg.plan.display()))?;
        let session = edge_runtime::budget::open_session(
            &plan,
            cfg.kernels,
            &rb,
            cfg.spill_dir.clone(),
            &sizes,
        )?;
        Ok((session, rb.whole))
    };
    let (mut session, budget) = match setup() {
        Ok(s) => s,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let info = PlanInfo {
        plan_name: cfg
            .plan
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default(),
        model: meta.model.name.clone(),
        digest: edge_schema::header::encode_hex(&plan.digest()),
        limits: Limits {
            sizes: meta.sizes.iter().map(|s| (s.width, s.height)).collect(),
            max_steps: cfg.max_steps,
            max_images: cfg.max_images,
            default_method: edge_runtime::sampler::SamplingMethod::for_class(meta.scheduler.class),
            plan_karras: meta.scheduler.use_karras_sigmas,
        },
        budget,
    };
    if ready.send(Ok(info.clone())).is_err() {
        return;
    }
    for mut job in rx {
        let reply = std::mem::replace(&mut job.reply, Box::new(|_| {}));
        let outcome = if shared.closing.load(Ordering::SeqCst) {
            Err(JobError::ShuttingDown)
        } else if job.gone.load(Ordering::SeqCst) {
            Err(JobError::Gone)
        } else {
            shared.interrupt.store(false, Ordering::SeqCst);
            let queue_wait = job.arrived.elapsed();
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run_job(&mut session, &info, &cfg, &shared, &job)
            }));
            *shared.running() = None;
            match run {
                Ok(Ok((images, truncated, run_time))) => Ok(Done {
                    job: job.number,
                    images,
                    queue_wait,
                    run_time,
                    truncated,
                }),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(JobError::Failed(
                    "internal error: the job panicked; the server goes on".into(),
                )),
            }
        };
        shared.pending.fetch_sub(1, Ordering::SeqCst);
        reply(outcome);
    }
}

/// A random seed from the OS.
fn random_seed() -> Result<u64, JobError> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b)
        .map_err(|e| JobError::Failed(format!("no random seed from the OS: {e}")))?;
    Ok(u64::from_le_bytes(b))
}

fn run_job(
    session: &mut Session<'_>,
    info: &PlanInfo,
    cfg: &WorkerConfig,
    shared: &Shared,
    job: &Job,
) -> Result<(Vec<Image>, bool, Duration), JobError> {
    let (number, spec) = (job.number, &job.spec);
    let started = Instant::now();
    let seed = match spec.seed {
        Some(s) => s,
        None => random_seed()?,
    };
    *shared.running() = Some(Progressing {
        job: number,
        started,
        image: 0,
        images: spec.count,
        step: 0,
        steps: spec.steps,
        units: 0,
    });
    let mut images = Vec::with_capacity(spec.count);
    let mut truncated = false;
    for i in 0..spec.count {
        let seed_i = seed.wrapping_add(i as u64);
        let params = GenerateParams {
            prompt: spec.prompt.clone(),
            negative_prompt: spec.negative_prompt.clone(),
            steps: spec.steps,
            cfg_scale: spec.cfg_scale,
            method: spec.method,
            seed: seed_i,
            width: spec.width,
            height: spec.height,
            rng: spec.rng,
            karras: spec.karras,
            init_latents: None,
            init_image: None,
            decoder: Default::default(),
            preview: None,
        };
        let mut timed_out = false;
        let out = edge_runtime::generate_with(session, &params, &mut |p| {
            if let Some(r) = shared.running().as_mut() {
                r.image = i;
                r.units += 1;
                if let Progress::Step { done, .. } = p {
                    r.step = done;
                }
            }
            if started.elapsed() > cfg.time_limit {
                timed_out = true;
                return Flow::Stop;
            }
            if shared.interrupt.load(Ordering::SeqCst) || job.gone.load(Ordering::SeqCst) {
                return Flow::Stop;
            }
            Flow::Continue
        });
        let out = match out {
            Ok(o) => o,
            Err(edge_runtime::Error::Interrupted { after }) => {
                let after = if spec.count > 1 {
                    format!("{after} of image {}/{}", i + 1, spec.count)
                } else {
                    after
                };
                return Err(if timed_out {
                    JobError::TimedOut {
                        limit: cfg.time_limit,
                        after,
                    }
                } else if shared.closing.load(Ordering::SeqCst) {
                    JobError::Stopped { after }
                } else if job.gone.load(Ordering::SeqCst) {
                    JobError::Gone
                } else {
                    JobError::Interrupted { after }
                });
            }
            Err(e @ edge_runtime::Error::Diverged { .. }) => {
                return Err(JobError::Diverged(e.to_string()))
            }
            // Clients see the plan's file name, not where it lies on the server.
            Err(e) => {
                let full = cfg.plan.display().to_string();
                return Err(JobError::Failed(
                    e.to_string().replace(&full, &info.plan_name),
                ));
            }
        };
        truncated |= out.truncated;
        let fields = GenerationInfo {
            prompt: spec.prompt.clone(),
            negative_prompt: spec.negative_prompt.clone(),
            steps: spec.steps,
            sampler: spec.method,
            cfg_scale: spec.cfg_scale,
            seed: seed_i,
            rng: spec.rng,
            karras: spec.karras.unwrap_or(info.limits.plan_karras),
            width: spec.width,
            height: spec.height,
            model: info.model.clone(),
            plan_name: info.plan_name.clone(),
            plan_digest: info.digest.clone(),
            init_latents: None,
            init_image: None,
        };
        let png =
            edge_runtime::image::encode_png(&out.rgb, spec.width, spec.height, &fields.png_text())
                .map_err(|e| JobError::Failed(format!("encoding the PNG: {e}")))?;
        images.push(Image {
            png,
            seed: seed_i,
            infotext: fields.a1111(),
        });
    }
    Ok((images, truncated, started.elapsed()))
}
