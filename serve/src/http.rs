//! The HTTP side: routes, API-key check, body limit, JSON errors, request log, shutdown on
//! SIGTERM / Ctrl-C. axum on tokio; the work itself runs on the [`Queue`]'s worker thread.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Request, State};
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
    /// Connections open at once; one more is answered 503 and closed. Bounds the memory the
    /// HTTP side can hold (`max_connections · max_body`), which is taken off `--max-ram`.
    pub max_connections: usize,
    /// Time a client has to send its request headers (then the connection is closed).
    pub header_timeout: Duration,
    /// Time a client has to send its request body (then 408).
    pub body_timeout: Duration,
}

/// After SIGTERM, how long connections still open may take to finish.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

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
            400 | 404 | 405 | 408 | 409 | 413 => "invalid_request_error",
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
    max_body: usize,
    body_timeout: Duration,
}

/// Queue wait of a response, for the request log.
#[derive(Clone, Copy)]
struct QueueWait(Duration);

/// Runs the server until SIGTERM or Ctrl-C; then stops accepting, stops the running job,
/// answers waiting ones with 503, lets open connections finish for [`SHUTDOWN_GRACE`] (a second
/// signal ends that wait) and returns.
///
/// # Errors
/// The plan cannot be opened (see [`Queue::start`]), the HTTP side's buffers do not fit the
/// budget, or the address cannot be bound.
pub fn serve(mut cfg: ServeConfig) -> Result<()> {
    let http_bytes = (cfg.max_connections as u64).saturating_mul(cfg.max_body as u64);
    let given = cfg.worker.max_ram;
    if let Some(b) = cfg.worker.max_ram {
        if http_bytes >= b {
            anyhow::bail!(
                "--max-ram {b}: the HTTP side may hold up to {} connections x {} bytes of request body = {http_bytes} bytes, leaving nothing for the plan; lower --max-connections or --max-body",
                cfg.max_connections,
                cfg.max_body
            );
        }
        cfg.worker.max_ram = Some(b - http_bytes);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the HTTP runtime")?;
    let (connections, body) = (cfg.max_connections, cfg.max_body);
    let (queue, info) = Queue::start(cfg.worker).map_err(|e| {
        // A budget refused under `--max-ram` is the given one less the HTTP side's share:
        // say so, or the number in the message is one the user never gave.
        let under_max_ram = matches!(
            e.downcast_ref::<edge_runtime::Error>(),
            Some(edge_runtime::Error::BudgetTooSmall {
                whence: edge_runtime::BudgetSource::MaxRam,
                ..
            })
        );
        match given {
            Some(b) if under_max_ram => e.context(format!(
                "--max-ram {b} bytes less the {http_bytes} bytes the HTTP side may hold \
                 ({connections} connections x {body} bytes of request body)"
            )),
            _ => e,
        }
    })?;
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
            "edgerun serve: listening on http://{local} (plan {}, sizes {}, queue {}, {} connections{})",
            info.plan_name,
            info.limits.sizes_text(),
            queue.capacity(),
            cfg.max_connections,
            if cfg.api_key.is_some() {
                ", API key required"
            } else {
                ""
            }
        );
        let state = Arc::new(AppState {
            page: page(&info, cfg.api_key.is_some()),
            key: cfg.api_key.as_deref().map(|k| blake3::hash(k.as_bytes())),
            max_body: cfg.max_body,
            body_timeout: cfg.body_timeout,
            queue,
            info,
        });
        let app = router(Arc::clone(&state));
        accept_loop(listener, app, state, cfg.max_connections, cfg.header_timeout).await;
        eprintln!("edgerun serve: stopped");
        Ok(())
    })
}

/// SIGTERM and Ctrl-C, as a stream of events.
struct Signals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn new() -> Signals {
        Signals {
            #[cfg(unix)]
            term: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok(),
        }
    }

    /// The next SIGTERM or Ctrl-C.
    async fn next(&mut self) {
        let ctrl_c = async {
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        #[cfg(unix)]
        let term = async {
            match self.term.as_mut() {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let term = std::future::pending::<()>();
        tokio::select! {
            () = ctrl_c => {},
            () = term => {},
        }
    }
}

/// Accepts connections (at most `max_connections` open; the next is answered 503 and closed)
/// and serves each with HTTP/1.1 (`header_timeout` to send the headers), until a signal.
async fn accept_loop(
    listener: tokio::net::TcpListener,
    app: Router,
    state: Arc<AppState>,
    max_connections: usize,
    header_timeout: Duration,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let mut signals = Signals::new();
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: wait, do not spin.
                    eprintln!("edgerun serve: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = signals.next() => break,
        };
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            let body = json!({"error": {
                "message": format!("too many connections (--max-connections {max_connections}); try again later"),
                "type": "rate_limit_error", "param": Value::Null, "code": Value::Null,
            }})
            .to_string();
            let reply = format!(
                "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 5\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            // Best effort on a fresh socket; the connection is closed either way.
            let _ = stream.try_write(reply.as_bytes());
            eprintln!("{} - - 503 (too many connections)", peer.ip());
            continue;
        };
        let svc = hyper_util::service::TowerToHyperService::new(
            app.clone().layer(axum::Extension(ConnectInfo(peer))),
        );
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .serve_connection(TokioIo::new(stream), svc);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    eprintln!(
        "edgerun serve: shutting down (the running job is stopped, waiting ones get 503; open connections get {} s)",
        SHUTDOWN_GRACE.as_secs()
    );
    state.queue.close();
    tokio::select! {
        () = graceful.shutdown() => {},
        () = tokio::time::sleep(SHUTDOWN_GRACE) => {
            eprintln!("edgerun serve: closing the connections still open");
        },
        () = signals.next() => {
            eprintln!("edgerun serve: second signal, closing the connections still open");
        },
    }
}

fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/health", get(health))
        .route("/favicon.ico", get(|| async { StatusCode::NO_CONTENT }))
        .route("/v1/images/generations", post(openai_generate))
        .route("/v1/models", get(openai_models))
        .route("/v1/models/{id}", get(openai_model))
        .route("/sdapi/v1/txt2img", post(txt2img))
        .route("/sdapi/v1/progress", get(progress))
        .route("/sdapi/v1/interrupt", post(interrupt))
        .route("/sdapi/v1/samplers", get(samplers))
        .route("/sdapi/v1/sd-models", get(sd_models))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
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
            let header = req.headers().get(header::AUTHORIZATION);
            let given = header
                .and_then(|v| v.to_str().ok())
                // The scheme is case-insensitive (RFC 9110 §11.1).
                .and_then(|v| v.split_once(' '))
                .and_then(|(scheme, k)| scheme.eq_ignore_ascii_case("bearer").then_some(k));
            let ok = given.is_some_and(|g| blake3::hash(g.trim().as_bytes()) == key);
            if !ok {
                let msg = match (header, given) {
                    (_, Some(_)) => "Authorization: the API key is wrong",
                    (Some(_), None) => "Authorization: expected `Bearer KEY`",
                    (None, _) => "Authorization: missing; this server needs the header `Authorization: Bearer KEY`",
                };
                return ApiError::new(StatusCode::UNAUTHORIZED, api_of(path), msg).into_response();
            }
        }
    }
    next.run(req).await
}

/// "client METHOD path" of a request, as the log writes it.
fn describe(req: &Request) -> String {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or_else(|| "-".to_string(), |c| c.0.ip().to_string());
    format!("{peer} {} {}", req.method(), req.uri().path())
}

/// One plain line per request on stderr: client, method, path, status, duration, queue wait.
async fn log(req: Request, next: Next) -> Response {
    let t = Instant::now();
    let what = describe(&req);
    let res = next.run(req).await;
    let wait = res
        .extensions()
        .get::<QueueWait>()
        .map_or(String::new(), |w| {
            format!(" queue {:.3}s", w.0.as_secs_f64())
        });
    eprintln!(
        "{what} {} {:.3}s{wait}",
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
        format!("no route {path}; this server has GET /, GET /health, POST /v1/images/generations, GET /v1/models, POST /sdapi/v1/txt2img, GET /sdapi/v1/progress, POST /sdapi/v1/interrupt, GET /sdapi/v1/samplers, GET /sdapi/v1/sd-models"),
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

/// The body, read within `timeout`; or the JSON error for one over `max` bytes (413, refused
/// from its `Content-Length` before reading when it states one), one that does not arrive in
/// time (408) or one that cannot be read (400).
async fn body(api: Api, req: Request, max: usize, timeout: Duration) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            api,
            format!(
                "the request body is larger than this server's limit of {max} bytes (--max-body)"
            ),
        )
    };
    let stated = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if stated.is_some_and(|n| n > max as u64) {
        return Err(too_large());
    }
    let limited = http_body_util::Limited::new(req.into_body(), max);
    match tokio::time::timeout(timeout, http_body_util::BodyExt::collect(limited)).await {
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            api,
            format!(
                "the request body did not arrive within {} s (--body-timeout)",
                timeout.as_secs_f64()
            ),
        )),
        Ok(Err(e))
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(too_large())
        }
        Ok(Err(e)) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            api,
            format!("the request body could not be read: {e}"),
        )),
        Ok(Ok(c)) => Ok(c.to_bytes()),
    }
}

/// Sets its flag when dropped: a handler future dropped because its client went away tells
/// the queue so, and logs the request (the log layer's future is dropped with it).
struct SetOnDrop {
    gone: Arc<AtomicBool>,
    finished: bool,
    started: Instant,
    /// Client, method and path, for the log line.
    what: String,
}

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.gone.store(true, Ordering::SeqCst);
        if !self.finished {
            eprintln!(
                "{} 499 {:.3}s (the client closed the connection; its job is dropped)",
                self.what,
                self.started.elapsed().as_secs_f64()
            );
        }
    }
}

/// Queues `spec` and waits for its images; `what` is the request's client, method and path.
async fn run(state: &AppState, api: Api, spec: JobSpec, what: String) -> Result<Done, ApiError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let gone = Arc::new(AtomicBool::new(false));
    let mut guard = SetOnDrop {
        gone: Arc::clone(&gone),
        finished: false,
        started: Instant::now(),
        what,
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
    req: Request,
) -> Result<Response, ApiError> {
    let api = Api::OpenAi;
    let what = describe(&req);
    let b = body(api, req, state.max_body, state.body_timeout).await?;
    let spec =
        request::parse_openai(&b, &state.info.limits).map_err(|e| ApiError::request(api, e))?;
    let prompt = spec.prompt.clone();
    let done = run(&state, api, spec, what).await?;
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

/// The plan as an OpenAI model object.
fn model_object(info: &PlanInfo) -> Value {
    json!({"id": info.plan_name, "object": "model", "created": 0, "owned_by": "edgerun"})
}

async fn openai_models(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_object(&state.info)]}))
}

async fn openai_model(
    State(state): State<Arc<AppState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Json<Value>, ApiError> {
    if id == state.info.plan_name {
        Ok(Json(model_object(&state.info)))
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            Api::OpenAi,
            format!(
                "no model {id:?}; this server serves {:?}",
                state.info.plan_name
            ),
        ))
    }
}

async fn txt2img(State(state): State<Arc<AppState>>, req: Request) -> Result<Response, ApiError> {
    let api = Api::A1111;
    let what = describe(&req);
    let b = body(api, req, state.max_body, state.body_timeout).await?;
    let spec =
        request::parse_txt2img(&b, &state.info.limits).map_err(|e| ApiError::request(api, e))?;
    let done = run(&state, api, spec.clone(), what).await?;
    let seeds: Vec<u64> = done.images.iter().map(|i| i.seed).collect();
    let sampler = spec.method.a1111_name();
    // The f32 as it prints (4.5, 0.1), not its f64 widening (0.10000000149011612).
    let cfg: Value = spec
        .cfg_scale
        .to_string()
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(Value::Null, Value::Number);
    let parameters = json!({
        "prompt": spec.prompt, "negative_prompt": spec.negative_prompt, "steps": spec.steps,
        "cfg_scale": cfg, "width": spec.width, "height": spec.height,
        "seed": seeds.first(), "sampler_name": sampler, "batch_size": 1,
        "n_iter": spec.count,
    });
    let info = json!({
        "prompt": spec.prompt, "negative_prompt": spec.negative_prompt,
        "seed": seeds.first(), "all_seeds": seeds, "steps": spec.steps,
        "cfg_scale": cfg, "sampler_name": sampler, "width": spec.width,
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
