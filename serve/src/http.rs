//! The HTTP side: routes, API-key check, body limit, JSON errors, request log, shutdown on
//! SIGTERM / Ctrl-C. axum on tokio; the work itself runs on the [`Queue`]'s worker thread.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use serde_json::{json, Value};

use crate::queue::{Done, JobError, PlanInfo, Queue, WorkerConfig};
use crate::request::{self, JobSpec, RequestError};

/// How `edgerun serve` listens.
#[derive(Debug)]
pub struct ServeConfig {
    pub worker: WorkerConfig,
    /// Address to bind (`--listen-ip`, default 127.0.0.1).
    pub ip: IpAddr,
    /// Port (`--listen-port`; 0 picks a free one, printed at start).
    pub port: u16,
    /// With a key, every route but `GET /`, `GET /health` and the favicon needs `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// Largest request body in bytes; a larger one gets 413.
    pub max_body: usize,
}

/// Which API's error shape a route answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    /// `{"error": {"message", "type", "param", "code"}}`.
    OpenAi,
    /// `{"error": kind, "detail": message, "param"}` (A1111 answers FastAPI's `detail`).
    A1111,
}

/// A JSON error response.
struct ApiError {
    status: StatusCode,
    api: Api,
    param: Option<&'static str>,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, api: Api, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            api,
            param: None,
            message: message.into(),
        }
    }

    fn request(api: Api, e: RequestError) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            api,
            param: e.field,
            message: e.message,
        }
    }

    fn job(api: Api, e: &JobError) -> ApiError {
        let status = match e {
            JobError::Full { .. } => StatusCode::TOO_MANY_REQUESTS,
            JobError::ShuttingDown | JobError::Stopped { .. } => StatusCode::SERVICE_UNAVAILABLE,
            JobError::Interrupted { .. } => StatusCode::CONFLICT,
            // Nobody reads this answer; 499 is what proxies log for it.
            JobError::Gone => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            JobError::TimedOut { .. } => StatusCode::GATEWAY_TIMEOUT,
            JobError::Diverged(_) => StatusCode::UNPROCESSABLE_ENTITY,
            JobError::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, api, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = match self.status.as_u16() {
            400 | 404 | 405 | 413 => "invalid_request_error",
            401 => "authentication_error",
            429 => "rate_limit_error",
            _ => "server_error",
        };
        let body = match self.api {
            Api::OpenAi => json!({"error": {
                "message": self.message, "type": kind, "param": self.param, "code": Value::Null,
            }}),
            Api::A1111 => json!({"error": kind, "detail": self.message, "param": self.param}),
        };
        let mut r = (self.status, Json(body)).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

struct AppState {
    queue: Queue,
    info: PlanInfo,
    /// BLAKE3 of the API key: comparing digests (whose `==` is constant-time) leaks neither
    /// the key's bytes nor its length.
    key: Option<blake3::Hash>,
    page: String,
}

/// Queue wait of a response, for the request log.
#[derive(Clone, Copy)]
struct QueueWait(Duration);

/// Runs the server until SIGTERM or Ctrl-C; then stops accepting, stops the running job,
/// answers waiting ones with 503 and returns.
///
/// # Errors
/// The plan cannot be opened (see [`Queue::start`]) or the address cannot be bound.
pub fn serve(cfg: ServeConfig) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the HTTP runtime")?;
    let (queue, info) = Queue::start(cfg.worker)?;
    rt.block_on(async move {
        let addr = SocketAddr::new(cfg.ip, cfg.port);
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| {
            format!(
                "--listen-ip {} --listen-port {}: cannot listen",
                cfg.ip, cfg.port
            )
        })?;
        let local = listener.local_addr().context("reading the bound address")?;
        eprintln!(
            "edgerun serve: listening on http://{local} (plan {}, sizes {}, queue {}{})",
            info.plan_name,
            info.limits.sizes_text(),
            queue.capacity(),
            if cfg.api_key.is_some() {
                ", API key required"
            } else {
                ""
            }
        );
        let state = Arc::new(AppState {
            page: page(&info, cfg.api_key.is_some()),
            key: cfg.api_key.as_deref().map(|k| blake3::hash(k.as_bytes())),
            queue,
            info,
        });
        let app = router(Arc::clone(&state), cfg.max_body);
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(shutdown(Arc::clone(&state)))
        .await
        .context("serving")?;
        eprintln!("edgerun serve: stopped");
        Ok(())
    })
}

/// Waits for SIGTERM or Ctrl-C, then closes the queue.
async fn shutdown(state: Arc<AppState>) {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    eprintln!("edgerun serve: shutting down (the running job is stopped, waiting ones get 503)");
    state.queue.close();
}

fn router(state: Arc<AppState>, max_body: usize) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/health", get(health))
        .route("/favicon.ico", get(|| async { StatusCode::NO_CONTENT }))
        .route("/v1/images/generations", post(openai_generate))
        .route("/v1/models", get(openai_models))
        .route("/sdapi/v1/txt2img", post(txt2img))
        .route("/sdapi/v1/progress", get(progress))
        .route("/sdapi/v1/interrupt", post(interrupt))
        .route("/sdapi/v1/samplers", get(samplers))
        .route("/sdapi/v1/sd-models", get(sd_models))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(middleware::from_fn_with_state(Arc::clone(&state), auth))
        .layer(middleware::from_fn(log))
        .with_state(state)
}

fn api_of(path: &str) -> Api {
    if path.starts_with("/sdapi/") {
        Api::A1111
    } else {
        Api::OpenAi
    }
}

/// `Authorization: Bearer KEY` on every route but the page and the health check.
async fn auth(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    if let Some(key) = state.key {
        if !matches!(path, "/" | "/health" | "/favicon.ico") {
            let given = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                // The scheme is case-insensitive (RFC 9110 §11.1).
                .and_then(|v| v.split_once(' '))
                .and_then(|(scheme, k)| scheme.eq_ignore_ascii_case("bearer").then_some(k));
            let ok = given.is_some_and(|g| blake3::hash(g.trim().as_bytes()) == key);
            if !ok {
                let msg = if given.is_some() {
                    "Authorization: the API key is wrong"
                } else {
                    "Authorization: missing; this server needs the header `Authorization: Bearer KEY`"
                };
                return ApiError::new(StatusCode::UNAUTHORIZED, api_of(path), msg).into_response();
            }
        }
    }
    next.run(req).await
}

/// One plain line per request on stderr: client, method, path, status, duration, queue wait.
async fn log(req: Request, next: Next) -> Response {
    let t = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip().to_string())
        .unwrap_or_else(|| "-".into());
    let res = next.run(req).await;
    let wait = res
        .extensions()
        .get::<QueueWait>()
        .map_or(String::new(), |w| {
            format!(" queue {:.3}s", w.0.as_secs_f64())
        });
    eprintln!(
        "{peer} {method} {path} {} {:.3}s{wait}",
        res.status().as_u16(),
        t.elapsed().as_secs_f64()
    );
    res
}

async fn not_found(req: Request) -> ApiError {
    let path = req.uri().path().to_string();
    ApiError::new(
        StatusCode::NOT_FOUND,
        api_of(&path),
        format!("no route {path}; this server has POST /v1/images/generations, POST /sdapi/v1/txt2img, GET /sdapi/v1/progress, POST /sdapi/v1/interrupt, GET /sdapi/v1/samplers, GET /health"),
    )
}

async fn method_not_allowed(req: Request) -> ApiError {
    let path = req.uri().path().to_string();
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        api_of(&path),
        format!("{} {path}: method not allowed", req.method()),
    )
}

async fn index(State(state): State<Arc<AppState>>) -> Html<String> {
    Html(state.page.clone())
}

async fn health(State(state): State<Arc<AppState>>) -> Json<Value> {
    let s = state.queue.status();
    Json(json!({
        "status": "ok",
        "plan": state.info.plan_name,
        "model": state.info.model,
        "sizes": state.info.limits.sizes_text(),
        "running": s.running.is_some(),
        "waiting": s.waiting,
        "budget_bytes": state.info.budget,
    }))
}

/// The body, or the JSON error for one over the limit (413) or unreadable (400).
fn body(api: Api, b: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    b.map_err(|e| {
        let status = e.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "the request body is larger than this server's limit (--max-body)".to_string()
        } else {
            format!("the request body could not be read: {e}")
        };
        ApiError::new(status, api, message)
    })
}

/// Sets its flag when dropped: a handler future dropped because its client went away tells
/// the queue so, and logs the request (the log layer's future is dropped with it).
struct SetOnDrop {
    gone: Arc<AtomicBool>,
    finished: bool,
    started: Instant,
}

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.gone.store(true, Ordering::SeqCst);
        if !self.finished {
            eprintln!(
                "- client closed the connection after {:.3}s; its job is dropped (499)",
                self.started.elapsed().as_secs_f64()
            );
        }
    }
}

/// Queues `spec` and waits for its images.
async fn run(state: &AppState, api: Api, spec: JobSpec) -> Result<Done, ApiError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let gone = Arc::new(AtomicBool::new(false));
    let mut guard = SetOnDrop {
        gone: Arc::clone(&gone),
        finished: false,
        started: Instant::now(),
    };
    let submitted = state.queue.submit(spec, gone, move |r| {
        let _ = tx.send(r);
    });
    guard.finished = submitted.is_err();
    submitted.map_err(|e| ApiError::job(api, &e))?;
    let r = rx.await;
    guard.finished = true;
    match r {
        Ok(Ok(done)) => Ok(done),
        Ok(Err(e)) => Err(ApiError::job(api, &e)),
        Err(_) => Err(ApiError::job(api, &JobError::ShuttingDown)),
    }
}

fn b64(png: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(png)
}

/// Headers every image response carries: the job number (order of arrival) and the seeds.
fn with_job_headers(mut r: Response, done: &Done) -> Response {
    let seeds: Vec<String> = done.images.iter().map(|i| i.seed.to_string()).collect();
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&done.job.to_string()) {
        h.insert("x-edgerun-job", v);
    }
    if let Ok(v) = HeaderValue::from_str(&seeds.join(",")) {
        h.insert("x-edgerun-seeds", v);
    }
    r.extensions_mut().insert(QueueWait(done.queue_wait));
    r
}

async fn openai_generate(
    State(state): State<Arc<AppState>>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let api = Api::OpenAi;
    let b = body(api, b)?;
    let spec =
        request::parse_openai(&b, &state.info.limits).map_err(|e| ApiError::request(api, e))?;
    let prompt = spec.prompt.clone();
    let done = run(&state, api, spec).await?;
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let data: Vec<Value> = done
        .images
        .iter()
        .map(|i| json!({"b64_json": b64(&i.png), "revised_prompt": prompt}))
        .collect();
    let r = Json(json!({"created": created, "data": data, "output_format": "png"})).into_response();
    Ok(with_job_headers(r, &done))
}

async fn openai_models(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [{
        "id": state.info.plan_name, "object": "model", "created": 0, "owned_by": "edgerun",
    }]}))
}

async fn txt2img(
    State(state): State<Arc<AppState>>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let api = Api::A1111;
    let b = body(api, b)?;
    let spec =
        request::parse_txt2img(&b, &state.info.limits).map_err(|e| ApiError::request(api, e))?;
    let done = run(&state, api, spec.clone()).await?;
    let seeds: Vec<u64> = done.images.iter().map(|i| i.seed).collect();
    let sampler = spec.method.a1111_name();
    let parameters = json!({
        "prompt": spec.prompt, "negative_prompt": spec.negative_prompt, "steps": spec.steps,
        "cfg_scale": spec.cfg_scale, "width": spec.width, "height": spec.height,
        "seed": seeds.first(), "sampler_name": sampler, "batch_size": 1,
        "n_iter": spec.count,
    });
    let info = json!({
        "prompt": spec.prompt, "negative_prompt": spec.negative_prompt,
        "seed": seeds.first(), "all_seeds": seeds, "steps": spec.steps,
        "cfg_scale": spec.cfg_scale, "sampler_name": sampler, "width": spec.width,
        "height": spec.height, "sd_model_name": state.info.model,
        "sd_model_hash": state.info.digest.get(..10),
        "infotexts": done.images.iter().map(|i| i.infotext.clone()).collect::<Vec<_>>(),
        "job": done.job, "queue_wait_s": done.queue_wait.as_secs_f64(),
        "run_time_s": done.run_time.as_secs_f64(), "prompt_truncated": done.truncated,
    });
    let images: Vec<String> = done.images.iter().map(|i| b64(&i.png)).collect();
    let r = Json(json!({"images": images, "parameters": parameters, "info": info.to_string()}))
        .into_response();
    Ok(with_job_headers(r, &done))
}

async fn progress(State(state): State<Arc<AppState>>) -> Json<Value> {
    let s = state.queue.status();
    let (progress, eta, st) = match &s.running {
        Some(r) => (
            r.progress,
            r.eta().unwrap_or(0.0),
            json!({
                "skipped": false, "interrupted": false, "job": format!("job {}", r.job),
                "job_count": r.images, "job_no": r.image, "sampling_step": r.step,
                "sampling_steps": r.steps, "waiting": s.waiting,
            }),
        ),
        None => (
            0.0,
            0.0,
            json!({
                "skipped": false, "interrupted": false, "job": "", "job_count": 0, "job_no": 0,
                "sampling_step": 0, "sampling_steps": 0, "waiting": s.waiting,
            }),
        ),
    };
    Json(json!({
        "progress": progress, "eta_relative": eta, "state": st,
        "current_image": Value::Null, "textinfo": Value::Null,
    }))
}

async fn interrupt(State(state): State<Arc<AppState>>) -> Json<Value> {
    state.queue.interrupt();
    Json(json!({}))
}

async fn samplers() -> Json<Value> {
    let list: Vec<Value> = request::SAMPLERS
        .iter()
        .map(|(name, _, aliases)| json!({"name": name, "aliases": aliases, "options": {}}))
        .collect();
    Json(Value::Array(list))
}

async fn sd_models(State(state): State<Arc<AppState>>) -> Json<Value> {
    let i = &state.info;
    Json(json!([{
        "title": format!("{} [{}]", i.plan_name, i.digest.get(..10).unwrap_or_default()),
        "model_name": i.model, "hash": i.digest.get(..10), "sha256": Value::Null,
        "filename": i.plan_name, "config": Value::Null,
    }]))
}

/// The page at `GET /`, with the plan's sizes as the size choices.
fn page(info: &PlanInfo, needs_key: bool) -> String {
    let sizes: String = info
        .limits
        .sizes
        .iter()
        .map(|(w, h)| format!("<option value=\"{w}x{h}\">{w}x{h}</option>"))
        .collect();
    include_str!("page.html")
        .replace("{{SIZES}}", &sizes)
        .replace("{{MAX_STEPS}}", &info.limits.max_steps.to_string())
        .replace("{{KEY_HIDDEN}}", if needs_key { "" } else { "hidden" })
        .replace("{{PLAN}}", &html_escape(&info.plan_name))
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
