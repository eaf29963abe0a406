//! `edgerun serve` over real HTTP on loopback, with a client nobody here wrote (`ureq`): the
//! image bytes equal the CLI's, jobs run one at a time in order of arrival inside the budget,
//! a full queue answers 429, bad requests get the right 4xx naming the field and the server
//! keeps serving, the API key is checked, interrupts and time limits stop a job, SIGTERM
//! ends the server with exit 0. The Python clients (`openai`, `requests`) and the browser
//! page are checked by `scripts/test-serve`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

const EDGEPLAN: &str = env!("CARGO_BIN_EXE_edgeplan");
const EDGERUN: &str = env!("CARGO_BIN_EXE_edgerun");
const PROMPT: &str = "a large red circle on a blue background";

fn demo_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../demo/pixart-shapes-64")
}

/// The demo model compiled for 64×64 and 128×128, once per test binary.
fn plan() -> &'static Path {
    static PLAN: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, p) = PLAN.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let plan = dir.path().join("demo.plan");
        let o = Command::new(EDGEPLAN)
            .args(["compile"])
            .arg(demo_model())
            .args(["-W", "64,128", "-H", "64,128", "-o"])
            .arg(&plan)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        (dir, plan)
    });
    p
}

/// A running `edgerun serve` on a free port; killed when dropped.
struct Server {
    child: Child,
    base: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        let mut child = Command::new(EDGERUN)
            .args(["serve", "--plan"])
            .arg(plan())
            .args(["--listen-port", "0", "-t", "2"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut base = None;
        let mut seen = Vec::new();
        for l in lines.by_ref() {
            let l = l.unwrap();
            if let Some(rest) = l.split("listening on ").nth(1) {
                base = Some(rest.split_whitespace().next().unwrap().to_string());
                break;
            }
            seen.push(l);
        }
        let base = base.unwrap_or_else(|| panic!("the server did not start: {seen:?}"));
        let log = Arc::new(Mutex::new(Vec::new()));
        let l2 = Arc::clone(&log);
        std::thread::spawn(move || {
            for l in lines.map_while(Result::ok) {
                l2.lock().unwrap().push(l);
            }
        });
        Server { child, base, log }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn post(
        &self,
        path: &str,
        body: &[u8],
        key: Option<&str>,
    ) -> (u16, Value, ureq::http::HeaderMap) {
        let mut r = agent()
            .post(&self.url(path))
            .header("Content-Type", "application/json");
        if let Some(k) = key {
            r = r.header("Authorization", &format!("Bearer {k}"));
        }
        let mut resp = r.send(body).unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .unwrap();
        let v = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text}"));
        (status, v, headers)
    }

    fn get(&self, path: &str) -> (u16, Value) {
        let mut resp = agent().get(&self.url(path)).call().unwrap();
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The server's exit status, waiting at most `limit` (after SIGTERM).
    fn wait_for_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let t = Instant::now();
        loop {
            if let Some(c) = self.child.try_wait().unwrap() {
                return c;
            }
            assert!(t.elapsed() < limit, "still running {limit:?} after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(300)))
        .build()
        .into()
}

fn png_of(v: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str().unwrap())
        .unwrap()
}

/// The CLI's PNG for the same parameters.
fn cli_png(seed: u64, steps: usize, size: u32) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cli.png");
    let s = size.to_string();
    let o = Command::new(EDGERUN)
        .args(["generate", "--plan"])
        .arg(plan())
        .args([
            "-p",
            PROMPT,
            "-s",
            &seed.to_string(),
            "--steps",
            &steps.to_string(),
        ])
        .args(["-W", &s, "-H", &s, "--quiet", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::read(out).unwrap()
}

/// An RGB8 PNG's pixels `[h, w, 3]`, width and height.
fn rgb_pixels(png_bytes: &[u8]) -> (Vec<u8>, u32, u32) {
    let dec = png::Decoder::new(std::io::Cursor::new(png_bytes));
    let mut r = dec.read_info().unwrap();
    let mut buf = vec![0; r.output_buffer_size().unwrap()];
    let info = r.next_frame(&mut buf).unwrap();
    (buf, info.width, info.height)
}

#[test]
fn images_equal_the_cli_and_show_the_prompt() {
    let srv = Server::start(&[]);
    // A1111 route: two images, seeds 7 and 8.
    let body = json!({"prompt": PROMPT, "seed": 7, "steps": 4, "cfg_scale": 4.5,
        "width": 128, "height": 128, "sampler_name": "DPM++ 2M", "batch_size": 2});
    let (st, v, h) = srv.post("/sdapi/v1/txt2img", body.to_string().as_bytes(), None);
    assert_eq!(st, 200, "{v}");
    let images = v["images"].as_array().unwrap();
    assert_eq!(images.len(), 2);
    assert_eq!(
        png_of(&images[0]),
        cli_png(7, 4, 128),
        "txt2img image 1 differs from the CLI's"
    );
    assert_eq!(
        png_of(&images[1]),
        cli_png(8, 4, 128),
        "txt2img image 2 differs from the CLI's"
    );
    assert_eq!(h.get("x-edgerun-seeds").unwrap(), "7,8");
    let info: Value = serde_json::from_str(v["info"].as_str().unwrap()).unwrap();
    assert_eq!(info["all_seeds"], json!([7, 8]));
    assert!(info["infotexts"][0]
        .as_str()
        .unwrap()
        .contains("Seed: 7, RNG: torch-cpu, Size: 128x128"));
    // OpenAI route at the size the demo model was trained at, as the README's main job.
    let body = json!({"model": "demo", "prompt": PROMPT, "n": 1, "size": "64x64",
        "response_format": "b64_json", "seed": 42, "steps": 20});
    let (st, v, _) = srv.post("/v1/images/generations", body.to_string().as_bytes(), None);
    assert_eq!(st, 200, "{v}");
    let png = png_of(&v["data"][0]["b64_json"]);
    assert_eq!(
        png,
        cli_png(42, 20, 64),
        "OpenAI image differs from the CLI's"
    );
    // The asked colours: the centre is red, a corner blue.
    let (px, w, _) = rgb_pixels(&png);
    let at = |x: u32, y: u32| {
        let i = ((y * w + x) * 3) as usize;
        (px[i] as i32, px[i + 1] as i32, px[i + 2] as i32)
    };
    let (r, g, b) = at(32, 32);
    assert!(r > g + 60 && r > b + 60, "centre not red: {:?}", (r, g, b));
    let (r, g, b) = at(3, 3);
    assert!(b > r + 60 && b > g + 30, "corner not blue: {:?}", (r, g, b));
}

#[test]
fn concurrent_requests_run_in_order_of_arrival_inside_the_budget() {
    let srv = Arc::new(Server::start(&["--max-ram", "400M"]));
    let t0 = Instant::now();
    let handles: Vec<_> = (0..8u64)
        .map(|i| {
            let srv = Arc::clone(&srv);
            // Sent 40 ms apart, so the order of arrival is the order of sending.
            std::thread::sleep(Duration::from_millis(40));
            std::thread::spawn(move || {
                let body =
                    json!({"prompt": PROMPT, "seed": i, "steps": 8, "width": 64, "height": 64});
                let (st, v, h) = srv.post("/sdapi/v1/txt2img", body.to_string().as_bytes(), None);
                assert_eq!(st, 200, "{v}");
                let job: u64 = h
                    .get("x-edgerun-job")
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                (i, job, t0.elapsed())
            })
        })
        .collect();
    let mut done: Vec<(u64, u64, Duration)> =
        handles.into_iter().map(|h| h.join().unwrap()).collect();
    done.sort_by_key(|d| d.0);
    let jobs: Vec<u64> = done.iter().map(|d| d.1).collect();
    assert!(
        jobs.windows(2).all(|w| w[0] < w[1]),
        "job numbers not in order of arrival: {jobs:?}"
    );
    let finished: Vec<Duration> = done.iter().map(|d| d.2).collect();
    assert!(
        finished.windows(2).all(|w| w[0] <= w[1]),
        "not finished in order of arrival: {finished:?}"
    );
    let status = std::fs::read_to_string(format!("/proc/{}/status", srv.pid())).unwrap();
    let hwm: u64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        hwm * 1024 <= 400 << 20,
        "peak RSS {hwm} KiB over the 400 MiB budget"
    );
    // The log has one line per request with its queue wait (the reader thread may lag).
    let t = Instant::now();
    let (lines, log) = loop {
        let log = srv.log.lock().unwrap().clone();
        let lines = log
            .iter()
            .filter(|l| l.contains("POST /sdapi/v1/txt2img 200") && l.contains(" queue "))
            .count();
        if lines >= 8 || t.elapsed() > Duration::from_secs(10) {
            break (lines, log);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(lines, 8, "{log:?}");
}

#[test]
fn a_full_queue_answers_429_and_the_rest_complete() {
    let srv = Arc::new(Server::start(&["--queue", "2"]));
    let handles: Vec<_> = (0..6u64)
        .map(|i| {
            let srv = Arc::clone(&srv);
            std::thread::spawn(move || {
                let body =
                    json!({"prompt": PROMPT, "seed": i, "steps": 40, "width": 64, "height": 64});
                let (st, v, h) = srv.post("/sdapi/v1/txt2img", body.to_string().as_bytes(), None);
                (st, v, h.get("retry-after").is_some())
            })
        })
        .collect();
    let res: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let full: Vec<_> = res.iter().filter(|r| r.0 == 429).collect();
    assert!(
        !full.is_empty(),
        "no 429 with a queue of 2 and 6 requests at once"
    );
    assert!(res.iter().all(|r| r.0 == 200 || r.0 == 429), "{res:?}");
    assert!(res.iter().filter(|r| r.0 == 200).count() >= 2);
    for r in full {
        assert!(
            r.1["detail"].as_str().unwrap().contains("queue is full"),
            "{}",
            r.1
        );
        assert!(r.2, "429 without Retry-After");
    }
    let body = json!({"prompt": PROMPT, "steps": 2, "width": 64, "height": 64});
    assert_eq!(
        srv.post("/sdapi/v1/txt2img", body.to_string().as_bytes(), None)
            .0,
        200
    );
}

#[test]
fn bad_requests_get_4xx_naming_the_field_and_the_server_goes_on() {
    let srv = Server::start(&["--max-body", "4K", "--max-steps", "50"]);
    let big = format!("{{\"prompt\":\"{}\"}}", "a".repeat(64 << 10));
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "/v1/images/generations",
            b"{not json".to_vec(),
            400,
            "not valid JSON",
        ),
        (
            "/v1/images/generations",
            br#"["a"]"#.to_vec(),
            400,
            "expected a JSON object",
        ),
        (
            "/v1/images/generations",
            br#"{"prompt": 5}"#.to_vec(),
            400,
            "prompt: expected a string",
        ),
        (
            "/v1/images/generations",
            br#"{"size": "64x64"}"#.to_vec(),
            400,
            "prompt: required",
        ),
        (
            "/v1/images/generations",
            br#"{"prompt": "a", "size": "100000x100000"}"#.to_vec(),
            400,
            "it holds 64x64, 128x128",
        ),
        (
            "/v1/images/generations",
            br#"{"prompt": "a", "size": "64x64", "n": 100}"#.to_vec(),
            400,
            "n: 100 is out of range",
        ),
        (
            "/v1/images/generations",
            br#"{"prompt": "a", "size": "64x64", "response_format": "url"}"#.to_vec(),
            400,
            "b64_json",
        ),
        (
            "/sdapi/v1/txt2img",
            br#"{"width": 64, "height": 64, "sampler_name": "LMS Karras"}"#.to_vec(),
            400,
            "unknown sampler",
        ),
        (
            "/sdapi/v1/txt2img",
            br#"{"width": 64, "height": 64, "steps": 51}"#.to_vec(),
            400,
            "steps: 51 is out of range",
        ),
        (
            "/sdapi/v1/txt2img",
            br#"{"width": 64, "height": 64, "steps": "20"}"#.to_vec(),
            400,
            "steps: expected a whole number",
        ),
        (
            "/sdapi/v1/txt2img",
            br#"{"width": 100000, "height": 100000}"#.to_vec(),
            400,
            "no size 100000x100000",
        ),
        (
            "/sdapi/v1/txt2img",
            br#"{"width": 64, "height": 64, "cfg_scale": "high"}"#.to_vec(),
            400,
            "cfg_scale: expected a number",
        ),
        (
            "/sdapi/v1/txt2img",
            big.into_bytes(),
            413,
            "larger than this server's limit",
        ),
        ("/sdapi/v1/nothing", b"{}".to_vec(), 404, "no route"),
    ];
    for (path, body, status, text) in &cases {
        let (st, v, _) = srv.post(path, body, None);
        assert_eq!(
            st,
            *status,
            "{path} {}: {v}",
            String::from_utf8_lossy(&body[..body.len().min(60)])
        );
        let msg = if path.starts_with("/sdapi") {
            v["detail"].as_str()
        } else {
            v["error"]["message"].as_str()
        }
        .unwrap_or_else(|| panic!("{path}: no message in {v}"));
        assert!(msg.contains(text), "{path}: {msg:?} lacks {text:?}");
    }
    let (st, v, _) = srv.post(
        "/sdapi/v1/txt2img",
        br#"{"width": 64, "height": 64, "steps": 0}"#,
        None,
    );
    assert_eq!((st, v["param"].as_str()), (400, Some("steps")));
    // Still serving.
    let (st, _, _) = srv.post(
        "/sdapi/v1/txt2img",
        br#"{"prompt": "a", "steps": 2, "width": 64, "height": 64}"#,
        None,
    );
    assert_eq!(st, 200);
    assert_eq!(srv.get("/health").0, 200);
}

#[test]
fn the_api_key_is_required_where_it_is_set() {
    let srv = Server::start(&["--api-key", "s3cret"]);
    let body = br#"{"prompt": "a", "steps": 2, "width": 64, "height": 64}"#;
    let (st, v, h) = srv.post("/sdapi/v1/txt2img", body, None);
    assert_eq!(st, 401, "{v}");
    assert_eq!(h.get("www-authenticate").unwrap(), "Bearer");
    assert!(v["detail"].as_str().unwrap().contains("missing"));
    let (st, v, _) = srv.post(
        "/v1/images/generations",
        br#"{"prompt": "a"}"#,
        Some("s3cret-not"),
    );
    assert_eq!(st, 401);
    assert!(v["error"]["message"].as_str().unwrap().contains("wrong"));
    assert_eq!(srv.post("/sdapi/v1/txt2img", body, Some("s3cret")).0, 200);
    assert_eq!(srv.get("/health").0, 200, "the health check needs no key");
    assert_eq!(srv.get("/sdapi/v1/samplers").0, 401);
    assert_eq!(
        srv.post("/sdapi/v1/txt2img", body, Some("s3cre")).0,
        401,
        "a prefix of the key"
    );
    // The scheme is case-insensitive.
    let r = agent()
        .get(&srv.url("/sdapi/v1/samplers"))
        .header("Authorization", "bearer s3cret")
        .call()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

/// Polls `/sdapi/v1/progress` until the running job has done a step.
fn wait_for_a_step(srv: &Server) -> Value {
    let t = Instant::now();
    loop {
        let (_, p) = srv.get("/sdapi/v1/progress");
        if p["state"]["sampling_step"].as_u64().unwrap_or(0) > 0 {
            return p;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no step reported: {p}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn interrupts_and_time_limits_stop_a_job_and_sigterm_exits_0() {
    let srv = Arc::new(Server::start(&[]));
    let long = json!({"prompt": PROMPT, "steps": 150, "width": 128, "height": 128}).to_string();
    let s2 = Arc::clone(&srv);
    let l2 = long.clone();
    let job = std::thread::spawn(move || s2.post("/sdapi/v1/txt2img", l2.as_bytes(), None));
    let p = wait_for_a_step(&srv);
    assert_eq!(p["state"]["sampling_steps"], 150);
    assert!(
        p["progress"].as_f64().unwrap() > 0.0 && p["progress"].as_f64().unwrap() < 1.0,
        "{p}"
    );
    assert_eq!(srv.post("/sdapi/v1/interrupt", b"", None).0, 200);
    let (st, v, _) = job.join().unwrap();
    assert_eq!(st, 409, "{v}");
    assert!(v["detail"].as_str().unwrap().contains("interrupted"), "{v}");
    let short = br#"{"prompt": "a", "steps": 2, "width": 64, "height": 64}"#;
    assert_eq!(
        srv.post("/sdapi/v1/txt2img", short, None).0,
        200,
        "the next job runs"
    );
    let srv = Arc::into_inner(srv).unwrap();
    drop(srv);

    // Tight for the 150-step job (over 3 s here), loose for the 2-step one (0.1 s) even on a
    // loaded machine.
    let timed = Server::start(&["--timeout", "1.5"]);
    let (st, v, _) = timed.post("/sdapi/v1/txt2img", long.as_bytes(), None);
    assert_eq!(st, 504, "{v}");
    assert!(
        v["detail"].as_str().unwrap().contains("limit of 1.5 s"),
        "{v}"
    );
    assert_eq!(timed.post("/sdapi/v1/txt2img", short, None).0, 200);
    drop(timed);

    let srv = Arc::new(Server::start(&[]));
    let s2 = Arc::clone(&srv);
    let job = std::thread::spawn(move || s2.post("/sdapi/v1/txt2img", long.as_bytes(), None));
    wait_for_a_step(&srv);
    let k = Command::new("kill")
        .args(["-TERM", &srv.pid().to_string()])
        .status()
        .unwrap();
    assert!(k.success());
    let (st, v, _) = job.join().unwrap();
    assert_eq!(st, 503, "{v}");
    assert!(
        v["detail"].as_str().unwrap().contains("shutting down"),
        "{v}"
    );
    let mut srv = Arc::into_inner(srv).unwrap();
    let code = srv.wait_for_exit(Duration::from_secs(30));
    assert!(code.success(), "exit status after SIGTERM: {code}");
}

/// A raw TCP connection to the server, for clients that misbehave.
fn raw(srv: &Server) -> std::net::TcpStream {
    let addr = srv.base.trim_start_matches("http://");
    let s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

/// Everything the server sends until it closes the connection or stops sending.
fn read_reply(s: &mut std::net::TcpStream) -> String {
    use std::io::Read;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.ends_with(b"}") {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&buf).to_string()
}

#[test]
fn slow_and_greedy_clients_are_bounded() {
    use std::io::Write;
    let srv = Server::start(&[
        "--header-timeout",
        "0.5",
        "--body-timeout",
        "0.5",
        "--max-connections",
        "4",
    ]);
    // Headers that never end: the connection is closed.
    let mut s = raw(&srv);
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n").unwrap();
    let t = Instant::now();
    assert_eq!(read_reply(&mut s), "", "a half-sent header got an answer");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "the connection stayed open"
    );
    // A body that never ends: 408 with JSON.
    let mut s = raw(&srv);
    s.write_all(b"POST /sdapi/v1/txt2img HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        .unwrap();
    let r = read_reply(&mut s);
    assert!(r.starts_with("HTTP/1.1 408"), "{r}");
    assert!(r.contains("did not arrive within 0.5 s"), "{r}");
    // A stated length over the limit: 413 before any body is sent.
    let mut s = raw(&srv);
    s.write_all(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Length: 5000000\r\nExpect: 100-continue\r\n\r\n")
        .unwrap();
    let r = read_reply(&mut s);
    assert!(r.starts_with("HTTP/1.1 413"), "{r}");
    assert!(r.contains("limit of 1048576 bytes"), "{r}");
    // Four connections held open: the fifth gets 503 and is closed. A server of its own with
    // the default header timeout, so the held connections outlast a loaded machine's delays.
    let limited = Server::start(&["--max-connections", "4"]);
    let held: Vec<_> = (0..4).map(|_| raw(&limited)).collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut fifth = raw(&limited);
    let r = read_reply(&mut fifth);
    assert!(r.starts_with("HTTP/1.1 503"), "{r}");
    assert!(r.contains("too many connections"), "{r}");
    drop(held);
    // The held connections time out or close; the server serves again.
    let t = Instant::now();
    loop {
        if let Ok(mut resp) = agent().get(&srv.url("/health")).call() {
            if resp.status() == 200 {
                let _ = resp.body_mut().read_to_string();
                break;
            }
        }
        assert!(t.elapsed() < Duration::from_secs(20), "no longer serving");
        std::thread::sleep(Duration::from_millis(100));
    }
    // A prompt with a NUL (it would cut the PNG text) is refused, naming the field.
    let (st, v, _) = srv.post(
        "/sdapi/v1/txt2img",
        br#"{"prompt": "a\u0000b", "width": 64, "height": 64}"#,
        None,
    );
    assert_eq!((st, v["param"].as_str()), (400, Some("prompt")), "{v}");
}

#[test]
fn sigterm_with_a_half_sent_request_still_exits() {
    use std::io::Write;
    let mut srv = Server::start(&["--body-timeout", "1"]);
    let mut s = raw(&srv);
    s.write_all(b"POST /sdapi/v1/txt2img HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let k = Command::new("kill")
        .args(["-TERM", &srv.pid().to_string()])
        .status()
        .unwrap();
    assert!(k.success());
    let code = srv.wait_for_exit(Duration::from_secs(15));
    assert!(code.success(), "{code}");
}

#[test]
fn bad_server_settings_and_damaged_plans_are_refused_at_start() {
    let run = |args: &[&str]| {
        Command::new(EDGERUN)
            .args(["serve", "--listen-port", "0"])
            .args(args)
            .output()
            .unwrap()
    };
    let p = plan().to_str().unwrap();
    for (args, text) in [
        (
            vec!["--plan", p, "--queue", "100000000000"],
            "--queue 100000000000: expected 1 to 4096",
        ),
        (
            vec!["--plan", p, "--max-images", "0"],
            "--max-images 0: expected 1 to 1000",
        ),
        (vec!["--plan", p, "--timeout", "1e20"], "--timeout"),
        (
            vec!["--plan", p, "--timeout", "-1"],
            "--timeout -1: expected a number of seconds",
        ),
        (
            vec!["--plan", p, "--max-ram", "32M", "--max-connections", "64"],
            "64 connections x 1048576 bytes",
        ),
    ] {
        let o = run(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(text), "{args:?}: {err}");
    }
    // One flipped byte deep in the weights: refused at start, naming the section.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("damaged.plan");
    let mut bytes = std::fs::read(plan()).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x5a;
    std::fs::write(&bad, &bytes).unwrap();
    let o = run(&["--plan", bad.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("checksum mismatch"), "{err}");
    assert_eq!(err.matches("damaged.plan").count(), 1, "{err}");
    assert!(!err.contains("listening"), "{err}");
}
