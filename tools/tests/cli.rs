//! Command-line tests of the real `edgeplan` and `edgerun` binaries: bad input must fail with a
//! non-zero exit, a one-line `error:` message naming the offending thing and what was expected,
//! and no output (target or temporary file) left behind; good input must produce a PNG carrying
//! its prompt, and the same plan, prompt and seed must give byte-identical PNGs whatever the
//! thread count (issue 6).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

const EDGEPLAN: &str = env!("CARGO_BIN_EXE_edgeplan");
const EDGERUN: &str = env!("CARGO_BIN_EXE_edgerun");
const PROMPT: &str = "a large red circle on a blue background";

/// `demo/pixart-shapes-64`.
fn demo_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../demo/pixart-shapes-64")
}

fn run(bin: &str, args: &[&str]) -> Output {
    Command::new(bin)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {bin}: {e}"))
}

fn s(p: &Path) -> &str {
    p.to_str().expect("temporary paths are UTF-8")
}

/// Names of the entries of `dir`, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .to_string()
        })
        .collect();
    v.sort();
    v
}

/// Whether `line` is one of `edgerun generate`'s plain progress lines (stderr not a terminal).
fn is_progress(line: &str) -> bool {
    line.starts_with("reading weights: ")
        || line.starts_with("writing the plan: ")
        || line.starts_with("encoded the prompt in ")
        || line.starts_with("encoded the init image in ")
        || line.starts_with("decoded the latents in ")
        || (line.starts_with("step ") && line.contains(" in "))
}

/// Asserts a failed run: non-zero exit, exactly one stderr line (besides progress lines)
/// starting with `error:` that contains every `needle`, and nothing written into `out_dir`.
fn assert_refused(what: &str, out: &Output, needles: &[&str], out_dir: &Path) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "{what}: expected failure, got success; stderr: {err}"
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{what}: exit status; stderr: {err}"
    );
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| !l.trim().is_empty() && !is_progress(l))
        .collect();
    assert_eq!(lines.len(), 1, "{what}: stderr must be one line, is: {err}");
    assert!(lines[0].starts_with("error: "), "{what}: {err}");
    for n in needles {
        assert!(lines[0].contains(n), "{what}: stderr lacks `{n}`: {err}");
    }
    // No cause printed twice (`a: b: b`).
    let parts: Vec<&str> = lines[0].split(": ").filter(|p| p.len() > 8).collect();
    for (i, p) in parts.iter().enumerate() {
        assert!(
            !parts[i + 1..].contains(p),
            "{what}: `{p}` appears twice: {err}"
        );
    }
    assert!(
        entries(out_dir).is_empty(),
        "{what}: left files behind: {:?}",
        entries(out_dir)
    );
}

/// `edgeplan compile` of the demo model at 64×64 with `extra` flags, written to `out`.
fn compile_demo_64(out: &Path, extra: &[&str]) -> Output {
    let model = demo_model();
    let mut args = vec!["compile", s(&model), "-W", "64", "-H", "64"];
    args.extend_from_slice(extra);
    args.extend(["-o", s(out)]);
    run(EDGEPLAN, &args)
}

/// A plan of the demo model for 64×64, compiled once per test binary with the real `edgeplan`.
fn demo_plan() -> &'static Path {
    static PLAN: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, p) = PLAN.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let plan = dir.path().join("demo.plan");
        let out = compile_demo_64(&plan, &[]);
        assert!(
            out.status.success(),
            "compiling the demo: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            entries(dir.path()),
            ["demo.plan"],
            "compile left extra files"
        );
        (dir, plan)
    });
    p
}

/// Copies the demo pipeline folder into `dst` (one level of component folders).
fn copy_demo(dst: &Path) {
    let src = demo_model();
    std::fs::create_dir_all(dst).expect("mkdir");
    for e in std::fs::read_dir(&src).expect("demo folder") {
        let e = e.expect("entry");
        let to = dst.join(e.file_name());
        if e.file_type().expect("file type").is_dir() {
            std::fs::create_dir_all(&to).expect("mkdir");
            for f in std::fs::read_dir(e.path()).expect("component folder") {
                let f = f.expect("entry");
                std::fs::copy(f.path(), to.join(f.file_name())).expect("copy");
            }
        } else {
            std::fs::copy(e.path(), &to).expect("copy");
        }
    }
}

fn compile_args<'a>(model: &'a str, out: &'a str, w: &'a str) -> Vec<&'a str> {
    vec!["compile", model, "-W", w, "-H", "64", "-o", out]
}

#[test]
fn compile_missing_model_folder() {
    let t = tempfile::tempdir().unwrap();
    let out_dir = t.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let model = t.path().join("no-such-model");
    let plan = out_dir.join("x.plan");
    let o = run(EDGEPLAN, &compile_args(s(&model), s(&plan), "64"));
    assert_refused("missing model folder", &o, &["no-such-model"], &out_dir);
}

#[test]
fn compile_missing_transformer_config() {
    let t = tempfile::tempdir().unwrap();
    let model = t.path().join("model");
    copy_demo(&model);
    std::fs::remove_file(model.join("transformer/config.json")).unwrap();
    let out_dir = t.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let plan = out_dir.join("x.plan");
    let o = run(EDGEPLAN, &compile_args(s(&model), s(&plan), "64"));
    assert_refused(
        "missing transformer config",
        &o,
        &["transformer", "config.json"],
        &out_dir,
    );
}

#[test]
fn compile_wrong_tensor_shape() {
    let t = tempfile::tempdir().unwrap();
    let model = t.path().join("model");
    copy_demo(&model);
    let st_path = model.join("transformer/diffusion_pytorch_model.safetensors");
    let bytes = std::fs::read(&st_path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let victim = "proj_out.weight";
    let orig = st.tensor(victim).expect("demo has proj_out.weight");
    let orig_shape = orig.shape().to_vec();
    assert_eq!(orig.dtype(), safetensors::Dtype::F32);
    // One column fewer than the model's config implies.
    let mut bad_shape = orig_shape.clone();
    *bad_shape.last_mut().unwrap() -= 1;
    let bad_data = vec![0u8; bad_shape.iter().product::<usize>() * 4];
    let mut views: Vec<(String, safetensors::tensor::TensorView<'_>)> = Vec::new();
    for (name, v) in st.tensors() {
        if name == victim {
            let bad = safetensors::tensor::TensorView::new(
                safetensors::Dtype::F32,
                bad_shape.clone(),
                &bad_data,
            )
            .unwrap();
            views.push((name, bad));
        } else {
            views.push((name, v));
        }
    }
    let rewritten = safetensors::serialize(views, None).unwrap();
    std::fs::write(&st_path, rewritten).unwrap();
    let out_dir = t.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let plan = out_dir.join("x.plan");
    let o = run(EDGEPLAN, &compile_args(s(&model), s(&plan), "64"));
    let expected = format!("expected {orig_shape:?}");
    let found = format!("{bad_shape:?}");
    assert_refused(
        "wrong tensor shape",
        &o,
        &["`proj_out.weight`", &found, &expected],
        &out_dir,
    );
}

#[test]
fn compile_bad_width() {
    let t = tempfile::tempdir().unwrap();
    let plan = t.path().join("x.plan");
    let o = run(EDGEPLAN, &compile_args(s(&demo_model()), s(&plan), "60"));
    assert_refused(
        "-W 60",
        &o,
        &["60x64", "-W/-H", "multiples of 16"],
        t.path(),
    );
}

/// A negative size or thread count is read as a number and refused naming its flag (clap
/// otherwise takes `-64` for the flag `-6`: "unexpected argument '-6'").
#[test]
fn negative_sizes_and_threads_name_the_flag() {
    let t = tempfile::tempdir().unwrap();
    let plan = t.path().join("x.plan");
    let png = t.path().join("out.png");
    let cases: [(&str, Output); 4] = [
        (
            "'-64' for '--width",
            run(EDGEPLAN, &compile_args(s(&demo_model()), s(&plan), "-64")),
        ),
        (
            "'-64' for '--width",
            generate(demo_plan(), &png, &["-W", "-64"]),
        ),
        (
            "'-64' for '--height",
            generate(demo_plan(), &png, &["-H", "-64"]),
        ),
        (
            "'-1' for '--threads",
            generate(demo_plan(), &png, &["-t", "-1"]),
        ),
    ];
    for (want, o) in cases {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(want), "{want}: {err}");
        assert!(!err.contains("unexpected argument"), "{err}");
    }
    assert!(!plan.exists() && !png.exists());
}

/// Runs `edgerun generate` on `plan` with 2 steps and `extra` arguments, writing `out`.
fn generate(plan: &Path, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "generate",
        "--plan",
        s(plan),
        "-p",
        PROMPT,
        "--steps",
        "2",
        "-o",
        s(out),
    ];
    args.extend_from_slice(extra);
    run(EDGERUN, &args)
}

#[test]
fn generate_unknown_sampling_method() {
    let t = tempfile::tempdir().unwrap();
    let png = t.path().join("out.png");
    let o = generate(demo_plan(), &png, &["--sampling-method", "foo"]);
    assert_refused(
        "--sampling-method foo",
        &o,
        &["--sampling-method", "\"foo\"", "dpm++2m", "euler"],
        t.path(),
    );
}

#[test]
fn generate_size_not_in_plan() {
    let t = tempfile::tempdir().unwrap();
    let png = t.path().join("out.png");
    let o = generate(demo_plan(), &png, &["-W", "128", "-H", "128"]);
    assert_refused("-W 128 -H 128", &o, &["128x128", "64x64"], t.path());
}

/// Writes `bytes` as a plan in a fresh folder and runs generate on it; the folder must end up
/// holding only the plan.
fn generate_on_damaged(what: &str, bytes: &[u8], needles: &[&str]) {
    let t = tempfile::tempdir().unwrap();
    let plan = t.path().join("bad.plan");
    std::fs::write(&plan, bytes).unwrap();
    let out_dir = t.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let o = generate(&plan, &out_dir.join("out.png"), &[]);
    let mut all = vec!["bad.plan"];
    all.extend_from_slice(needles);
    assert_refused(what, &o, &all, &out_dir);
}

fn le_u64(b: &[u8], at: usize) -> usize {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize
}

#[test]
fn generate_corrupted_plans() {
    let good = std::fs::read(demo_plan()).unwrap();
    // Header fields (schema/src/header.rs): metadata offset/length at 16/24, weights at 32/40.
    let (meta_off, meta_len) = (le_u64(&good, 16), le_u64(&good, 24));
    let (w_off, w_len) = (le_u64(&good, 32), le_u64(&good, 40));
    assert_eq!(meta_off + meta_len, good.len());
    assert!(w_len > 200);

    let mut b = good.clone();
    b[60] ^= 0x01; // inside the recorded metadata digest
    generate_on_damaged("flipped header byte", &b, &["checksum", "header"]);

    let mut b = good.clone();
    b[w_off + 100] ^= 0x01; // inside the first weight section
    generate_on_damaged("flipped weight byte", &b, &["checksum", "weight section 0"]);

    let mut b = good.clone();
    b[meta_off + meta_len / 2] ^= 0x01;
    generate_on_damaged("flipped metadata byte", &b, &["checksum", "metadata"]);

    let b = &good[..good.len() - 1];
    generate_on_damaged(
        "truncated plan",
        b,
        &["truncated", &format!("{}", good.len() - 1)],
    );

    let b = &good[..100];
    generate_on_damaged("truncated header", b, &["truncated", "header"]);

    // A short text file is not a plan (the magic is checked before the length).
    let b = b"a prompt list given as the plan\n";
    generate_on_damaged("short text file", b, &["not a plan file", "\"a prompt\""]);
}

#[test]
fn generate_init_latents_wrong_shape() {
    let t = tempfile::tempdir().unwrap();
    let lat = t.path().join("lat.safetensors");
    let data = vec![0u8; 4 * 16 * 16 * 4];
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![1, 4, 16, 16], &data)
            .unwrap();
    std::fs::write(
        &lat,
        safetensors::serialize([("latents", view)], None).unwrap(),
    )
    .unwrap();
    let out_dir = t.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let o = generate(
        demo_plan(),
        &out_dir.join("out.png"),
        &["--init-latents", s(&lat)],
    );
    assert_refused(
        "--init-latents [1,4,16,16]",
        &o,
        &[
            "lat.safetensors",
            "`latents`",
            "[1, 4, 16, 16]",
            "expected F32 [1, 4, 8, 8]",
        ],
        &out_dir,
    );
}

#[test]
fn generate_missing_plan() {
    let t = tempfile::tempdir().unwrap();
    let plan = t.path().join("nothing-here.plan");
    let out_dir = t.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let o = generate(&plan, &out_dir.join("out.png"), &[]);
    assert_refused(
        "missing plan",
        &o,
        &["nothing-here.plan", "No such file"],
        &out_dir,
    );
}

/// The `tEXt` chunks of a PNG as (keyword, text) pairs.
fn png_text(png: &[u8]) -> Vec<(String, String)> {
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    let mut out = Vec::new();
    let mut at = 8;
    while at + 8 <= png.len() {
        let len = u32::from_be_bytes(png[at..at + 4].try_into().unwrap()) as usize;
        let kind = &png[at + 4..at + 8];
        let body = &png[at + 8..at + 8 + len];
        if kind == b"tEXt" {
            let nul = body
                .iter()
                .position(|&c| c == 0)
                .expect("tEXt keyword terminator");
            out.push((
                String::from_utf8_lossy(&body[..nul]).to_string(),
                String::from_utf8_lossy(&body[nul + 1..]).to_string(),
            ));
        }
        at += 12 + len;
    }
    out
}

/// Parses AUTOMATIC1111 `parameters` text: the prompt line, the `Negative prompt: ` line and
/// the last line's `Key: value` fields (values quoted as JSON strings when they hold `,` or
/// `:`). Panics when the layout is not that.
fn a1111(text: &str) -> (String, String, std::collections::BTreeMap<String, String>) {
    let lines: Vec<&str> = text.split('\n').collect();
    assert_eq!(lines.len(), 3, "three lines: {text:?}");
    let negative = lines[1]
        .strip_prefix("Negative prompt: ")
        .unwrap_or_else(|| panic!("second line: {text:?}"));
    let mut fields = std::collections::BTreeMap::new();
    let mut rest = lines[2];
    while !rest.is_empty() {
        let (key, after) = rest
            .split_once(": ")
            .unwrap_or_else(|| panic!("field in {rest:?}"));
        let (value, next) = if after.starts_with('"') {
            let mut end = 1;
            let b = after.as_bytes();
            while b[end] != b'"' {
                end += if b[end] == b'\\' { 2 } else { 1 };
            }
            let v: String = serde_json::from_str(&after[..=end]).expect("JSON string");
            (v, after[end + 1..].strip_prefix(", ").unwrap_or(""))
        } else {
            match after.split_once(", ") {
                Some((v, n)) => (v.to_string(), n),
                None => (after.to_string(), ""),
            }
        };
        assert!(
            fields.insert(key.to_string(), value).is_none(),
            "{key} twice in {text:?}"
        );
        rest = next;
    }
    (lines[0].to_string(), negative.to_string(), fields)
}

/// Every field of the PNG's `parameters` is the one the run used (each with a value no other
/// field has, so a field recording another's value is caught); the plan is named by file name
/// and digest, never by the path as typed; prompts cannot forge lines or fields.
#[test]
fn png_parameters_record_every_field() {
    let t = tempfile::tempdir().unwrap();
    let sub = t.path().join("private-folder-name");
    std::fs::create_dir(&sub).unwrap();
    let plan = sub.join("my.plan");
    std::fs::copy(demo_plan(), &plan).unwrap();
    let png = t.path().join("p.png");
    let init = t.path().join("noise.safetensors");
    let noise: Vec<u8> = (0..256)
        .flat_map(|i| ((i as f32 * 0.37).sin()).to_le_bytes())
        .collect();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![1, 4, 8, 8], &noise)
            .unwrap();
    std::fs::write(
        &init,
        safetensors::serialize([("latents", view)], None).unwrap(),
    )
    .unwrap();
    let prompt = "a red circle\nNegative prompt: forged\nSteps: 99, Seed: 1";
    let o = run(
        EDGERUN,
        &[
            "generate",
            "--plan",
            s(&plan),
            "-p",
            prompt,
            "-n",
            "blurry, \\ ugly",
            "--steps",
            "3",
            "--cfg-scale",
            "2.5",
            "--sampling-method",
            "euler",
            "-s",
            "12345",
            "--init-latents",
            s(&init),
            "-o",
            s(&png),
            "--quiet",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = png_text(&std::fs::read(&png).unwrap());
    let params = &text
        .iter()
        .find(|(k, _)| k == "parameters")
        .expect("parameters")
        .1;
    let (p, n, f) = a1111(params);
    assert_eq!(
        p,
        "a red circle\\nNegative prompt: forged\\nSteps: 99, Seed: 1"
    );
    assert_eq!(n, "blurry, \\\\ ugly");
    let digest = {
        let plan = edge_runtime::Plan::open(&plan).unwrap();
        edge_schema::header::encode_hex(&plan.digest())
    };
    let want = [
        ("Steps", "3".to_string()),
        ("Sampler", "Euler".to_string()),
        ("CFG scale", "2.5".to_string()),
        ("Seed", "12345".to_string()),
        ("Size", "64x64".to_string()),
        ("Model hash", digest[..10].to_string()),
        ("Model", "pixart-shapes-64".to_string()),
        ("Plan", "my.plan".to_string()),
        ("Plan digest", digest.clone()),
        ("Init latents", "noise.safetensors".to_string()),
        ("Version", format!("edgerun {}", env!("CARGO_PKG_VERSION"))),
    ];
    for (k, v) in &want {
        assert_eq!(f.get(*k), Some(v), "field {k} in {params:?}");
    }
    assert_eq!(f.len(), want.len(), "{f:?}");
    for (k, v) in &text {
        assert!(
            !v.contains("private-folder-name"),
            "the plan's path leaked into {k}: {v}"
        );
    }
    // DPM++ 2M spelled as A1111 does; the seeded run records no init latents.
    let png2 = t.path().join("q.png");
    let o = generate(&plan, &png2, &["--quiet", "-s", "7"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = png_text(&std::fs::read(&png2).unwrap());
    let (_, _, f) = a1111(&text.iter().find(|(k, _)| k == "parameters").unwrap().1);
    assert_eq!(f["Sampler"], "DPM++ 2M");
    assert_eq!(f["Seed"], "7");
    assert_eq!(f["RNG"], "torch-cpu", "the default generator is recorded");
    assert!(!f.contains_key("Init latents"));
    let o = generate(&plan, &png2, &["--quiet", "-s", "7", "--rng", "edge"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = png_text(&std::fs::read(&png2).unwrap());
    let (_, _, f) = a1111(&text.iter().find(|(k, _)| k == "parameters").unwrap().1);
    assert_eq!(f["RNG"], "edge");
    let o = generate(&plan, &png2, &["--quiet", "--rng", "nv"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--rng: unknown generator \"nv\""));
}

/// Prompts may start with `-`; an output named like another format is refused before any
/// work; progress is printed as plain lines when stderr is not a terminal, and not at all
/// with `--quiet`.
#[test]
fn hyphen_prompts_output_names_and_plain_progress() {
    let t = tempfile::tempdir().unwrap();
    let png = t.path().join("h.png");
    let o = run(
        EDGERUN,
        &[
            "generate",
            "--plan",
            s(demo_plan()),
            "-p",
            "-a red circle",
            "-n",
            "--blurry",
            "--steps",
            "2",
            "-o",
            s(&png),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    for line in [
        "encoded the prompt in",
        "step 1/2 in",
        "step 2/2 in",
        "decoded the latents in",
    ] {
        assert!(err.contains(line), "no `{line}` in {err}");
    }
    let text = png_text(&std::fs::read(&png).unwrap());
    let (p, n, _) = a1111(&text.iter().find(|(k, _)| k == "parameters").unwrap().1);
    assert_eq!((p.as_str(), n.as_str()), ("-a red circle", "--blurry"));
    let o = generate(demo_plan(), &t.path().join("q.png"), &["--quiet"]);
    assert!(o.status.success());
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    for (flag, name, needles) in [
        ("-o", "out.jpg", vec!["-o", "out.jpg", ".png"]),
        ("-o", "out.PNG.webp", vec!["-o", ".webp", ".png"]),
        (
            "--latents-out",
            "lat.png",
            vec!["--latents-out", "lat.png", ".safetensors"],
        ),
    ] {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join(name);
        let mut extra = vec![];
        let out = if flag == "-o" {
            target.clone()
        } else {
            extra = vec![flag, s(&target)];
            d.path().join("ok.png")
        };
        let o = generate(demo_plan(), &out, &extra);
        assert_refused(name, &o, &needles, d.path());
    }
}

#[test]
fn compile_and_generate_png_with_prompt_and_latents() {
    let t = tempfile::tempdir().unwrap();
    let plan = t.path().join("x.plan");
    let o = compile_demo_64(&plan, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(EDGEPLAN, &["inspect", s(&plan)]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("64x64"));
    let png = t.path().join("out.png");
    let lat = t.path().join("lat.safetensors");
    let o = generate(&plan, &png, &["--latents-out", s(&lat), "--quiet"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(entries(t.path()), ["lat.safetensors", "out.png", "x.plan"]);
    let bytes = std::fs::read(&png).unwrap();
    let text = png_text(&bytes);
    let params = text
        .iter()
        .find(|(k, _)| k == "parameters")
        .unwrap_or_else(|| panic!("no `parameters` tEXt chunk in {text:?}"));
    let (prompt, negative, fields) = a1111(&params.1);
    assert_eq!(prompt, PROMPT);
    assert_eq!(negative, "");
    assert_eq!(fields["Steps"], "2");
    let lbytes = std::fs::read(&lat).unwrap();
    let st = safetensors::SafeTensors::deserialize(&lbytes).unwrap();
    let l = st.tensor("latents").unwrap();
    assert_eq!(l.dtype(), safetensors::Dtype::F32);
    assert_eq!(l.shape(), [1, 4, 8, 8]);
    let vals: Vec<f32> = l
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert!(vals.iter().all(|x| x.is_finite()));
    assert!(vals.iter().any(|&x| x != 0.0));
}

/// Issue 6: same plan, prompt and seed → byte-identical PNGs for 1, 2 and 3 threads and
/// across two runs.
#[test]
fn generate_is_deterministic_across_threads_and_runs() {
    let t = tempfile::tempdir().unwrap();
    let mut outs = Vec::new();
    for (i, threads) in ["1", "2", "3", "3"].iter().enumerate() {
        let png = t.path().join(format!("out{i}.png"));
        let o = generate(demo_plan(), &png, &["-t", threads, "-s", "7", "--quiet"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        outs.push((threads, std::fs::read(&png).unwrap()));
    }
    for (threads, b) in &outs[1..] {
        assert!(
            b == &outs[0].1,
            "-t {threads} gives a different PNG than -t 1"
        );
    }
}

#[test]
fn long_prompts_are_truncated_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("long.png");
    let prompt = "a large red circle on a blue background ".repeat(60);
    let args = [
        "generate",
        "--plan",
        s(demo_plan()),
        "-p",
        &prompt,
        "--steps",
        "1",
        "-o",
        s(&png),
    ];
    let out = run(EDGERUN, &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning") && err.contains("truncated") && err.contains("300"),
        "{err}"
    );
    let out = generate(demo_plan(), &png, &[]);
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("truncated"));
}

/// A plan compiled for aarch64 runs on the workstation through the generic kernels, and
/// `edgeplan verify --reference` compares it with diffusers' run from the same noise.
#[test]
fn verify_runs_an_aarch64_plan_against_the_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("arm.plan");
    let fx = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/pixart-sigma-tiny");
    let out = run(
        EDGEPLAN,
        &[
            "compile",
            s(&fx),
            "-W",
            "64",
            "-H",
            "64",
            "--target",
            "aarch64-neon",
            "-o",
            s(&plan),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reference = fx.join("reference/pipeline_dpm_4_cat_64x64.safetensors");
    let args = [
        "verify",
        s(&plan),
        "--reference",
        s(&reference),
        "-p",
        "a lovely cat",
        "--steps",
        "4",
    ];
    let out = run(EDGEPLAN, &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("rel L2"));
    // A wrong prompt gives other latents: refused.
    let args = [
        "verify",
        s(&plan),
        "--reference",
        s(&reference),
        "-p",
        "a dog",
        "--steps",
        "4",
    ];
    let out = run(EDGEPLAN, &args);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("differ from the reference"));
    // A reference whose final latents have another shape (here one element) or are not finite
    // was compared over the shorter array, or NaN-blind, and passed.
    let bytes = std::fs::read(&reference).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let noise = st.tensor("initial_noise").unwrap();
    let nan = f32::NAN.to_le_bytes().repeat(noise.data().len() / 4);
    let one = 0f32.to_le_bytes();
    for (label, shape, data, needles) in [
        (
            "[1]",
            vec![1],
            &one[..],
            ["final_latents is [1]", "expected [1, 4, 8, 8]"],
        ),
        (
            "NaN",
            noise.shape().to_vec(),
            &nan[..],
            ["final_latents holds NaN", "finite"],
        ),
    ] {
        let bad = dir.path().join("bad-ref.safetensors");
        let latents =
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape, data).unwrap();
        let noise_view = safetensors::tensor::TensorView::new(
            safetensors::Dtype::F32,
            noise.shape().to_vec(),
            noise.data(),
        )
        .unwrap();
        std::fs::write(
            &bad,
            safetensors::serialize(
                [("initial_noise", noise_view), ("final_latents", latents)],
                None,
            )
            .unwrap(),
        )
        .unwrap();
        let args = [
            "verify",
            s(&plan),
            "--reference",
            s(&bad),
            "-p",
            "a lovely cat",
            "--steps",
            "4",
        ];
        let out = run(EDGEPLAN, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{label}: {err}");
        for n in needles.iter().chain(&["bad-ref.safetensors"]) {
            assert!(err.contains(n), "{label}: no `{n}` in {err}");
        }
    }

    // The same with Q8_0 weights, which the aarch64 target repacks (Interleaved4x8): inspect
    // shows the layout and verify runs the repacked plan here. The bound is twice the rel L2
    // the generic kernels measure for this plan against the f32 reference (3.32e-2, weight
    // quantization error), as scripts/test-aarch64 uses.
    let q8 = dir.path().join("arm-q8.plan");
    let out = run(
        EDGEPLAN,
        &[
            "compile",
            s(&fx),
            "-W",
            "64",
            "-H",
            "64",
            "--target",
            "aarch64-neon",
            "--quant",
            "q8_0",
            "-o",
            s(&q8),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(EDGEPLAN, &["inspect", s(&q8)]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("q8_0 (interleaved 4x8)"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = run(
        EDGEPLAN,
        &[
            "verify",
            s(&q8),
            "--reference",
            s(&reference),
            "-p",
            "a lovely cat",
            "--steps",
            "4",
            "--tolerance",
            "6.6e-2",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A guidance scale that overflows f32 is refused once the latents stop being finite, naming
/// the step and the scale, and no image is written.
#[test]
fn generate_diverging_guidance_is_refused() {
    // Refused before any work by the CLI's bound; the runtime's own divergence check is tested
    // in tests/tests/demo.rs (`diverging_guidance_names_the_step`).
    let t = tempfile::tempdir().unwrap();
    let png = t.path().join("out.png");
    let o = generate(demo_plan(), &png, &["--cfg-scale", "1e38"]);
    assert_refused(
        "--cfg-scale 1e38",
        &o,
        &["--cfg-scale", "expected a number from 0 to 100"],
        t.path(),
    );
}

/// When the PNG cannot be written after its `--latents-out` file was (here a file-size limit of
/// 4 KiB, `RLIMIT_FSIZE` with `SIGXFSZ` ignored, so the write fails with EFBIG as on a full
/// disk), the run fails naming `-o` and removes the latents it wrote: no latents without their
/// image, no temporary file left.
#[cfg(unix)]
#[test]
fn latents_out_removed_when_the_png_write_fails() {
    use std::os::unix::process::CommandExt;
    let t = tempfile::tempdir().unwrap();
    let png = t.path().join("out.png");
    let lat = t.path().join("lat.safetensors");
    let mut cmd = Command::new(EDGERUN);
    cmd.args([
        "generate",
        "--plan",
        s(demo_plan()),
        "-p",
        PROMPT,
        "--steps",
        "2",
        "-o",
        s(&png),
        "--latents-out",
        s(&lat),
    ]);
    // SAFETY: between fork and exec only async-signal-safe calls (setrlimit, signal) run; an
    // ignored signal stays ignored across exec.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 4096,
                rlim_max: 4096,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let o = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains(s(&png)), "the error names -o: {err}");
    assert_eq!(
        entries(t.path()),
        Vec::<String>::new(),
        "files left after the failed PNG write: {err}"
    );
}

/// A negative guidance scale is refused as the server refuses it (a scale up to 1 turns guidance
/// off, as in diffusers), naming the flag and the range; a scale of 0 or 1 says nothing.
#[test]
fn negative_guidance_scale_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let png = t.path().join("out.png");
    let o = generate(demo_plan(), &png, &["--cfg-scale", "-5"]);
    assert_refused(
        "--cfg-scale -5",
        &o,
        &["--cfg-scale -5", "expected a number from 0 to 100"],
        t.path(),
    );
    for ok in ["0", "1"] {
        let o = generate(demo_plan(), &png, &["--cfg-scale", ok]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success() && !err.contains("--cfg-scale"), "{err}");
    }
}

/// `-o` naming a directory or a device is refused and left as it was (a rename would replace
/// `/dev/null` for every other program); a symbolic link is followed.
#[test]
fn generate_output_that_is_not_a_regular_file() {
    let t = tempfile::tempdir().unwrap();
    let dir_out = t.path().join("a-directory");
    std::fs::create_dir(&dir_out).unwrap();
    let o = generate(demo_plan(), &dir_out, &["--quiet"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a regular file"));
    assert!(dir_out.is_dir());
    let o = generate(demo_plan(), Path::new("/dev/null"), &["--quiet"]);
    assert!(!o.status.success(), "writing over /dev/null was accepted");
    assert!(!std::fs::metadata("/dev/null").unwrap().is_file());
    #[cfg(unix)]
    {
        let real = t.path().join("real.png");
        std::fs::write(&real, b"old").unwrap();
        let link = t.path().join("link.png");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let o = generate(demo_plan(), &link, &["--quiet"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(&std::fs::read(&real).unwrap()[..4], b"\x89PNG");
    }
}

/// Prompts outside Latin-1 (curly quotes, emoji, CJK) generate an image; the parameters go in
/// an iTXt chunk.
#[test]
fn generate_with_a_unicode_prompt() {
    let t = tempfile::tempdir().unwrap();
    let png = t.path().join("u.png");
    let o = run(
        EDGERUN,
        &[
            "generate",
            "--plan",
            s(demo_plan()),
            "-p",
            "a “red” circle 🔴 猫",
            "-n",
            "blurry — ugly",
            "--steps",
            "2",
            "--quiet",
            "-o",
            s(&png),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.windows(4).any(|w| w == b"iTXt"), "no iTXt chunk");
}

#[test]
fn every_kernel_table_gives_the_same_png() {
    // `--kernels` picks each table this CPU has; the x86 SIMD tables are bit-identical to the
    // generic one, so the PNG bytes (pixels and metadata) must not change.
    let t = tempfile::tempdir().unwrap();
    let reference = t.path().join("generic.png");
    let o = generate(
        demo_plan(),
        &reference,
        &["--kernels", "generic", "-s", "3", "--quiet", "-v"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let listed = String::from_utf8_lossy(&o.stderr).to_string();
    // The demo plan is monolithic: its weights are made resident at the first of 2 steps.
    assert!(
        listed.contains("weight bytes made resident per sampler step [")
            && listed.contains(", 0] (a monolithic plan's at its first step"),
        "{listed}"
    );
    let tables = listed
        .lines()
        .find_map(|l| l.split("(tables: ").nth(1))
        .and_then(|r| r.split(';').next())
        .expect("-v lists the tables")
        .to_string();
    let want = std::fs::read(&reference).unwrap();
    for label in tables.split(", ").filter(|l| l.starts_with("avx")) {
        let png = t.path().join(format!("{label}.png"));
        let o = generate(
            demo_plan(),
            &png,
            &["--kernels", label, "-s", "3", "--quiet"],
        );
        assert!(
            o.status.success(),
            "{label}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            std::fs::read(&png).unwrap() == want,
            "--kernels {label} changes the PNG"
        );
    }
    let empty = tempfile::tempdir().unwrap();
    let o = generate(
        demo_plan(),
        &empty.path().join("x.png"),
        &["--kernels", "sse9", "--quiet"],
    );
    assert_refused(
        "unknown kernel table",
        &o,
        &[
            "--kernels \"sse9\"",
            "unknown kernel table",
            "avx512+vnni",
            "neon+i8mm",
        ],
        empty.path(),
    );
    // A table this build knows but this CPU lacks (NEON on x86-64, AVX2 on aarch64).
    let absent = if cfg!(target_arch = "aarch64") {
        "avx2"
    } else {
        "neon"
    };
    let o = generate(
        demo_plan(),
        &empty.path().join("x.png"),
        &["--kernels", absent, "--quiet"],
    );
    assert_refused(
        "kernel table absent on this CPU",
        &o,
        &[
            "this CPU",
            "cannot run that kernel table",
            "generic",
            "best (= ",
        ],
        empty.path(),
    );
    if !cfg!(target_arch = "aarch64") {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("NEON tables need an aarch64 CPU"), "{err}");
    }
}

#[test]
fn bench_profiles_every_stage() {
    let o = run(EDGERUN, &["bench", "--plan", s(demo_plan()), "--reps", "2"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    for needle in [
        "peak of one thread",
        "t5 encode (one prompt)",
        "again",
        "denoiser NFE (2 runs, all 300 context tokens kept): median",
        // The demo prompt keeps 9 of the 300 tokens: the padding is skipped, and timed apart.
        "denoiser NFE with the prompt's mask (",
        "vae decode",
        "TextEncoder",
        // The op table of the denoiser sums the timed NFEs, and says so.
        "ms in ops (summed over the 2 NFEs timed above)",
        "VaeDecoder",
        "linear",
        // The products with the GELU fused into their epilogue are a row of their own.
        "linear+gelu_tanh",
        "attention",
        "conv2d",
        // The demo VAE's 3×3 convolutions (32–64 channels) are Winograd's, counted apart.
        "conv2d winograd",
    ] {
        assert!(
            text.contains(needle),
            "bench output lacks {needle:?}:\n{text}"
        );
    }
    let o = run(
        EDGERUN,
        &["bench", "--plan", s(demo_plan()), "--stage", "unet"],
    );
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--stage unet"));
    // A plan that cannot be opened is named with its flag, as `generate` names it.
    let (dir, empty) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let missing = dir.path().join("missing.plan");
    let o = run(EDGERUN, &["bench", "--plan", s(&missing)]);
    assert_refused(
        "bench, no plan",
        &o,
        &["--plan: ", "missing.plan"],
        empty.path(),
    );
    let junk = dir.path().join("junk.plan");
    let mut bytes = vec![0x8f, 0x13, 0x3a, 0xff, 0, 1, 2, 3];
    bytes.resize(4096, 0);
    std::fs::write(&junk, bytes).unwrap();
    let o = run(EDGERUN, &["bench", "--plan", s(&junk)]);
    assert_refused(
        "bench, not a plan",
        &o,
        &[
            "--plan: ",
            "junk.plan",
            "bytes 8f 13 3a ff 00 01 02 03 (hex)",
        ],
        empty.path(),
    );
}

#[test]
fn bench_stage_profiles_only_that_stage() {
    let o = run(
        EDGERUN,
        &[
            "bench",
            "--plan",
            s(demo_plan()),
            "--stage",
            "vae",
            "--reps",
            "1",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("VaeDecoder") && text.contains("vae decode"),
        "{text}"
    );
    assert!(
        !text.contains("TextEncoder") && !text.contains("denoiser NFE"),
        "{text}"
    );
}

#[test]
fn a_closed_output_pipe_is_not_a_panic() {
    use std::process::Stdio;
    for args in [
        vec!["bench", "--plan", s(demo_plan()), "--reps", "1"],
        vec![
            "generate",
            "--plan",
            s(demo_plan()),
            "-p",
            "x",
            "--steps",
            "1",
            "-v",
            "-o",
        ],
    ] {
        let t = tempfile::tempdir().unwrap();
        let png = t.path().join("x.png");
        let mut cmd = Command::new(EDGERUN);
        cmd.args(&args);
        if args[0] == "generate" {
            cmd.arg(&png);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn edgerun");
        // Close both pipes before the program writes: every write then fails with EPIPE.
        drop(child.stdout.take());
        drop(child.stderr.take());
        let status = child.wait().unwrap();
        assert_ne!(
            status.code(),
            Some(101),
            "{args:?} panicked on a closed pipe"
        );
        assert!(status.success(), "{args:?}: {status}");
    }
}

#[test]
fn absurd_thread_counts_are_clamped_with_a_warning() {
    let t = tempfile::tempdir().unwrap();
    let png = t.path().join("x.png");
    let o = generate(demo_plan(), &png, &["-t", "99999999999", "--quiet"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("-t 99999999999") && err.contains("using"),
        "{err}"
    );
}

#[test]
fn a_plan_with_trailing_bytes_is_named_as_such() {
    let t = tempfile::tempdir().unwrap();
    let mut bytes = std::fs::read(demo_plan()).unwrap();
    bytes.extend_from_slice(b"xx");
    let plan = t.path().join("long.plan");
    std::fs::write(&plan, &bytes).unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    let o = generate(&plan, &out_dir.path().join("x.png"), &["--quiet"]);
    assert_refused("trailing bytes", &o, &["2 trailing bytes"], out_dir.path());
}

#[test]
fn outputs_never_overwrite_inputs_or_each_other() {
    let t = tempfile::tempdir().unwrap();
    let plan = t.path().join("self.plan");
    std::fs::copy(demo_plan(), &plan).unwrap();
    let original = std::fs::read(&plan).unwrap();
    let hard = t.path().join("hard.plan");
    std::fs::hard_link(&plan, &hard).unwrap();
    let sym = t.path().join("sym.plan");
    std::os::unix::fs::symlink(&plan, &sym).unwrap();
    let dotted = t.path().join("sub/../self.plan");
    std::fs::create_dir(t.path().join("sub")).unwrap();
    let refused = |args: &[&str], needles: &[&str]| {
        let o = run(EDGERUN, args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        for n in needles {
            assert!(err.contains(n), "{args:?}: stderr lacks {n:?}: {err}");
        }
        assert!(
            std::fs::read(&plan).unwrap() == original,
            "{args:?} changed the plan"
        );
    };
    for out in [&plan, &hard, &dotted] {
        refused(
            &[
                "generate",
                "--plan",
                s(&plan),
                "-p",
                "x",
                "--steps",
                "1",
                "-o",
                s(out),
            ],
            &["refusing to write over an input", "--plan"],
        );
    }
    refused(
        &[
            "generate",
            "--plan",
            s(&sym),
            "-p",
            "x",
            "--steps",
            "1",
            "--latents-out",
            s(&plan),
        ],
        &["--latents-out", "same file as --plan"],
    );
    let png = t.path().join("x.png");
    refused(
        &[
            "generate",
            "--plan",
            s(&plan),
            "-p",
            "x",
            "--steps",
            "1",
            "-o",
            s(&png),
            "--latents-out",
            s(&t.path().join("sub/../x.png")),
        ],
        &["-o", "--latents-out", "same file"],
    );
    assert!(!png.exists(), "a refused run wrote its output");
    // edgeplan compile -o onto one of the model's own files.
    let m = t.path().join("model");
    copy_demo(&m);
    let vae = m.join("vae/diffusion_pytorch_model.safetensors");
    let before = std::fs::read(&vae).unwrap();
    let o = run(
        EDGEPLAN,
        &["compile", s(&m), "-W", "64", "-H", "64", "-o", s(&vae)],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("refusing to write over an input"), "{err}");
    assert!(
        std::fs::read(&vae).unwrap() == before,
        "compile overwrote its own input"
    );
}

#[test]
fn non_finite_or_huge_init_latents_are_named_at_load() {
    let t = tempfile::tempdir().unwrap();
    let write = |name: &str, vals: &[f32], extra: bool| {
        let lat = t.path().join(name);
        let data: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let view =
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![1, 4, 8, 8], &data)
                .unwrap();
        let mut tensors = vec![("latents", view.clone())];
        if extra {
            tensors.push(("noise2", view));
        }
        std::fs::write(&lat, safetensors::serialize(tensors, None).unwrap()).unwrap();
        lat
    };
    let refused = |lat: &Path, needles: &[&str]| {
        let out_dir = tempfile::tempdir().unwrap();
        let o = generate(
            demo_plan(),
            &out_dir.path().join("o.png"),
            &["--init-latents", s(lat)],
        );
        let what = format!("--init-latents {}", lat.display());
        assert_refused(&what, &o, &[&[&what[..]], needles].concat(), out_dir.path());
    };
    // (values set, the index named, how the value is shown)
    for (set, index, shown) in [
        (vec![(0usize, f32::NAN)], 0usize, "NaN"),
        (vec![(77, f32::INFINITY)], 77, "inf"),
        (vec![(255, f32::NEG_INFINITY)], 255, "-inf"),
        // Finite but far outside standard normal noise: a saturated image otherwise.
        (vec![(9, 1e30)], 9, "1e30"),
        (vec![(10, -2000.0)], 10, "-2e3"),
        // The first bad value is named, whichever check it fails.
        (vec![(3, 2000.0), (20, f32::NAN)], 3, "2e3"),
    ] {
        let mut vals = vec![0.25f32; 4 * 8 * 8];
        for &(i, v) in &set {
            vals[i] = v;
        }
        let lat = write(&format!("lat{index}.safetensors"), &vals, false);
        refused(&lat, &[shown, &format!("flat index {index}")]);
    }
    // A second tensor beside `latents` is named, not ignored.
    let lat = write("two.safetensors", &[0.25f32; 4 * 8 * 8], true);
    refused(&lat, &["`noise2`", "one f32 tensor `latents`"]);
}

#[test]
fn a_missing_output_folder_is_refused_before_any_work() {
    let t = tempfile::tempdir().unwrap();
    let file = t.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    for (flag, out, needle) in [
        ("-o", t.path().join("missing/x.png"), "missing"),
        (
            "--latents-out",
            t.path().join("missing/l.safetensors"),
            "missing",
        ),
        ("-o", file.join("x.png"), "is not a folder"),
    ] {
        let o = if flag == "-o" {
            generate(demo_plan(), &out, &[])
        } else {
            generate(
                demo_plan(),
                &t.path().join("ok.png"),
                &["--latents-out", s(&out)],
            )
        };
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{flag} {}: {err}", out.display());
        assert!(err.contains(flag) && err.contains(needle), "{err}");
        let dir = out.parent().unwrap().display().to_string();
        assert!(err.contains(&dir), "does not name the folder {dir}: {err}");
        assert!(
            !t.path().join("ok.png").exists(),
            "wrote -o although --latents-out was refused"
        );
    }
}

/// A plan compiled for a budget that leaves nothing for the process itself (`--max-ram 12M
/// --planning-headroom 0`) is refused at the start of a run, naming the plan's budget and the
/// flags that set it, not later with an arena limit of 0 bytes; a smaller `--max-ram` at run
/// time is named as the budget's source instead.
#[test]
fn a_plan_budget_smaller_than_the_process_is_named_at_the_start() {
    let t = tempfile::tempdir().unwrap();
    let plan = t.path().join("tight.plan");
    let o = compile_demo_64(&plan, &["--max-ram", "12M", "--planning-headroom", "0"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = tempfile::tempdir().unwrap();
    let png = out.path().join("x.png");
    let o = generate(&plan, &png, &[]);
    assert_refused(
        "a 12 MiB plan budget",
        &o,
        &[
            "more than the budget of 12582912 bytes",
            "bytes the process already holds",
            "the plan's own",
            "--planning-headroom",
            s(&plan),
        ],
        out.path(),
    );
    let o = generate(&plan, &png, &["--max-ram", "3M"]);
    assert_refused(
        "--max-ram 3M",
        &o,
        &[
            "more than the budget of 3145728 bytes (--max-ram)",
            s(&plan),
        ],
        out.path(),
    );
    // The same budget at run time as the plan's: the plan's (a run cannot raise it).
    let o = generate(&plan, &png, &["--max-ram", "12M"]);
    assert_refused(
        "--max-ram 12M",
        &o,
        &["the plan's own", s(&plan)],
        out.path(),
    );
    // A compile budget below the planning headroom names the headroom.
    let o = compile_demo_64(&t.path().join("none.plan"), &["--max-ram", "24M"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && err.contains("--max-ram 25165824 bytes")
            && err.contains("planning headroom of 134217728 bytes")
            && err.contains("--planning-headroom")
            && !t.path().join("none.plan").exists(),
        "{err}"
    );
}

#[test]
fn seed_minus_one_picks_a_random_seed_and_records_it() {
    let t = tempfile::tempdir().unwrap();
    let seed_of = |png: &Path| -> u64 {
        let text = png_text(&std::fs::read(png).unwrap());
        let params = &text
            .iter()
            .find(|(k, _)| k == "parameters")
            .expect("parameters")
            .1;
        a1111(params).2["Seed"].parse().expect("a whole seed")
    };
    let (a, b) = (t.path().join("a.png"), t.path().join("b.png"));
    for p in [&a, &b] {
        let o = generate(demo_plan(), p, &["-s", "-1"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(&format!("seed: {} (random)", seed_of(p))),
            "{err}"
        );
    }
    assert_ne!(seed_of(&a), seed_of(&b), "two random seeds were equal");
    // The recorded seed reproduces the image byte for byte.
    let again = t.path().join("again.png");
    let seed = seed_of(&a).to_string();
    let o = generate(demo_plan(), &again, &["-s", &seed]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read(&again).unwrap() == std::fs::read(&a).unwrap());
    for bad in ["-2", "abc", "1.5", "18446744073709551616"] {
        let out_dir = tempfile::tempdir().unwrap();
        let o = generate(demo_plan(), &out_dir.path().join("x.png"), &["-s", bad]);
        assert_refused(
            "bad seed",
            &o,
            &["-s/--seed", bad, "-1 for a random seed"],
            out_dir.path(),
        );
    }
}

#[test]
fn inspect_checks_every_section_digest() {
    let o = run(EDGEPLAN, &["inspect", s(demo_plan())]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("weight sections verified (BLAKE3)"));
    // Each text encoder stage says which prompts it takes (the full length, then the buckets).
    for l in [300, 16, 128] {
        let want = format!("t5_encoder (TextEncoder, prompts up to {l} tokens)");
        assert!(text.contains(&want), "{want}: {text}");
    }
    let t = tempfile::tempdir().unwrap();
    let bad = t.path().join("bad.plan");
    let mut bytes = std::fs::read(demo_plan()).unwrap();
    bytes[5000] ^= 0xff; // inside the first weight section (sections start at 4096)
    std::fs::write(&bad, &bytes).unwrap();
    let o = run(EDGEPLAN, &["inspect", s(&bad)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("bad.plan") && err.contains("weight section 0"),
        "{err}"
    );
    // Nothing of the damaged plan is described: the error alone.
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

/// Reads `label N KiB` out of `text` (the `-v` memory line).
/// The peak RSS `edgerun -v` printed in `err`, after asserting that it is within the
/// prediction it printed beside it.
fn within_prediction(err: &str) -> u64 {
    let (peak, predicted) = (
        kib_after(err, "peak RSS (VmHWM)"),
        kib_after(err, "predicted peak"),
    );
    assert!(
        peak <= predicted,
        "peak {peak} KiB above the predicted {predicted} KiB"
    );
    peak
}

fn kib_after(text: &str, label: &str) -> u64 {
    let at = text
        .find(label)
        .unwrap_or_else(|| panic!("no `{label}` in: {text}"));
    text[at + label.len()..]
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after `{label}` in: {text}"))
}

/// The demo compiled at 256² under `--max-ram budget` and without a budget, in `dir`, and the
/// first plan's `inspect` text.
fn budget_plans(dir: &Path, budget: &str) -> (PathBuf, PathBuf, String) {
    let model = demo_model();
    let (tiled, whole) = (dir.join("tiled.plan"), dir.join("whole.plan"));
    let base = ["compile", s(&model), "-W", "256", "-H", "256"];
    let out = run(
        EDGEPLAN,
        &[&base[..], &["--max-ram", budget, "-o", s(&tiled)]].concat(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(run(EDGEPLAN, &[&base[..], &["-o", s(&whole)]].concat())
        .status
        .success());
    let text = String::from_utf8_lossy(&run(EDGEPLAN, &["inspect", s(&tiled)]).stdout).to_string();
    (tiled, whole, text)
}

/// The decoded pixel bytes of the PNG at `p`.
fn png_pixels(p: &Path) -> Vec<u8> {
    let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(p).unwrap()));
    let mut r = dec.read_info().unwrap();
    let mut buf = vec![0; r.output_buffer_size().unwrap()];
    r.next_frame(&mut buf).unwrap();
    buf
}

/// A budget that the whole-image VAE decoder does not fit makes `edgeplan` choose exact tiles
/// (shown by `inspect`); `edgerun -v` names the mode and the bytes held, measures a peak RSS
/// within its prediction, and writes the image of the untiled plan, pixel for pixel.
#[test]
fn budget_forced_exact_tiles_stay_within_the_predicted_peak_and_match_the_whole_image() {
    let dir = tempfile::tempdir().unwrap();
    let (tiled, whole, text) = budget_plans(dir.path(), "172M");
    assert!(
        text.contains("exact tiles") && text.contains("halo of 2"),
        "{text}"
    );
    let size = ["-W", "256", "-H", "256", "-s", "3"];
    let (a, b) = (dir.path().join("a.png"), dir.path().join("b.png"));
    let run_a = generate(&tiled, &a, &[&size[..], &["-v"]].concat());
    let err = String::from_utf8_lossy(&run_a.stderr);
    assert!(run_a.status.success(), "{err}");
    assert!(
        err.contains("vae decode: exact tiles") && err.contains("bytes held"),
        "{err}"
    );
    within_prediction(&err);
    assert!(generate(&whole, &b, &size).status.success());
    assert!(
        png_pixels(&a) == png_pixels(&b),
        "exact tiles changed the image"
    );
}

/// A budget that the whole-image VAE encoder does not fit makes `edgeplan` encode init images
/// in exact tiles, here with the activations held in a spill file (shown by `inspect`): image to
/// image names the mode and the bytes held (`-v`), stays within the predicted peak, leaves the
/// spill folder empty and writes the untiled plan's image, pixel for pixel.
#[test]
fn budget_forced_exact_encoder_tiles_give_the_untiled_image_to_image() {
    let dir = tempfile::tempdir().unwrap();
    let (tiled, whole, text) = budget_plans(dir.path(), "150M");
    assert!(
        text.contains("VAE encoded in exact tiles") && text.contains("halo of 1"),
        "{text}"
    );
    let size = ["-W", "256", "-H", "256"];
    let init = dir.path().join("init.png");
    assert!(generate(&whole, &init, &[&size[..], &["-s", "3"]].concat())
        .status
        .success());
    let spill = dir.path().join("spill");
    std::fs::create_dir(&spill).unwrap();
    let args = [&size[..], &["-s", "5", "-i", s(&init), "--strength", "0.7"]].concat();
    let (a, b) = (dir.path().join("a.png"), dir.path().join("b.png"));
    let run_a = generate(
        &tiled,
        &a,
        &[&args[..], &["-v", "--spill-dir", s(&spill)]].concat(),
    );
    let err = String::from_utf8_lossy(&run_a.stderr);
    assert!(run_a.status.success(), "{err}");
    assert!(
        err.contains("vae encode: exact tiles")
            && err.contains("held between GroupNorms in a spill file"),
        "{err}"
    );
    within_prediction(&err);
    assert!(
        err.contains("memory encode image: measured peak")
            && err.contains("predicted vae_encoder_down"),
        "{err}"
    );
    assert_eq!(
        entries(&spill),
        Vec::<String>::new(),
        "spill file left behind"
    );
    // A spill folder that does not exist: refused before any work, naming the flag and what
    // spills (here the decode, checked first; `pipeline::generate` checks the encode's), no
    // image written.
    let c = dir.path().join("c.png");
    let missing = dir.path().join("no-such-folder");
    let run_c = generate(
        &tiled,
        &c,
        &[&args[..], &["--spill-dir", s(&missing)]].concat(),
    );
    let err = String::from_utf8_lossy(&run_c.stderr);
    assert!(!run_c.status.success() && !c.exists(), "{err}");
    assert!(
        err.contains("--spill-dir")
            && err.contains("in a spill file there")
            && !err.contains("step"),
        "{err}"
    );
    // Only the encode spills (the decode estimates its statistics): refused before any work
    // all the same, naming the encode.
    let enc_only = dir.path().join("enc-only.plan");
    let o = run(
        EDGEPLAN,
        &[
            "compile",
            s(&demo_model()),
            "-W",
            "256",
            "-H",
            "256",
            "--max-ram",
            "150M",
            "--vae-tile-mode",
            "estimate",
            "-o",
            s(&enc_only),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let run_d = generate(
        &enc_only,
        &c,
        &[&args[..], &["-v", "--spill-dir", s(&missing)]].concat(),
    );
    let err = String::from_utf8_lossy(&run_d.stderr);
    assert!(!run_d.status.success() && !c.exists(), "{err}");
    assert!(
        err.contains("--spill-dir")
            && err.contains("VAE encode of the init image")
            && !err.contains("timings"),
        "{err}"
    );
    let run_b = generate(&whole, &b, &args);
    assert!(
        run_b.status.success(),
        "{}",
        String::from_utf8_lossy(&run_b.stderr)
    );
    assert!(
        png_pixels(&a) == png_pixels(&b),
        "exact encoder tiles changed the image"
    );
}

/// `--vae-tile-mode estimate`: `inspect` names the reduction and its measured bound, `edgerun
/// -v` the estimate pass; the image stays close to the whole-image decode's (the bounds of
/// `edge_schema::tiles::ESTIMATE_BOUND_LEVELS`), closer than tiles decoded alone.
#[test]
fn estimated_statistics_are_planned_shown_and_close_to_the_whole_image() {
    let dir = tempfile::tempdir().unwrap();
    let model = demo_model();
    let base = [
        "compile",
        s(&model),
        "-W",
        "256",
        "-H",
        "256",
        "--vae-tile-size",
        "96",
    ];
    let plans: Vec<PathBuf> = ["estimate", "blend"]
        .iter()
        .map(|mode| {
            let p = dir.path().join(format!("{mode}.plan"));
            let o = run(
                EDGEPLAN,
                &[&base[..], &["--vae-tile-mode", mode, "-o", s(&p)]].concat(),
            );
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            p
        })
        .collect();
    let whole = dir.path().join("whole.plan");
    assert!(run(
        EDGEPLAN,
        &[&base[..2], &["-W", "256", "-H", "256", "-o", s(&whole)]].concat()
    )
    .status
    .success());
    for (flags, needle) in [
        (
            &["--vae-tile-mode", "estimate", "--vae-estimate-factor", "-3"][..],
            "--vae-estimate-factor `-3`",
        ),
        (
            &[
                "--vae-tile-mode",
                "estimate",
                "--vae-estimate-factor",
                "abc",
            ][..],
            "--vae-estimate-factor `abc`",
        ),
        (
            &[
                "--vae-tile-mode",
                "estimate",
                "--vae-estimate-factor",
                "99999999999",
            ][..],
            "2…64",
        ),
        (
            &["--vae-tile-mode", "blend", "--vae-estimate-factor", "4"][..],
            "blended tiles estimate no statistics",
        ),
    ] {
        let out = dir.path().join("bad.plan");
        let o = run(EDGEPLAN, &[&base[..], flags, &["-o", s(&out)]].concat());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && !out.exists(), "{flags:?}: {err}");
        assert!(
            err.contains(needle) && err.lines().count() == 1,
            "{flags:?}: {err}"
        );
    }
    let text =
        String::from_utf8_lossy(&run(EDGEPLAN, &["inspect", s(&plans[0])]).stdout).to_string();
    assert!(
        text.contains("GroupNorm statistics estimated")
            && text.contains("reduced to 16x16 (1/2 per axis")
            && text.contains("measured within 11 levels"),
        "{text}"
    );
    let size = ["-W", "256", "-H", "256", "-s", "3"];
    let out = |n: &str| dir.path().join(n);
    let o = generate(&plans[0], &out("e.png"), &[&size[..], &["-v"]].concat());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("vae decode: estimated statistics") && err.contains("reduced to 16x16"),
        "{err}"
    );
    within_prediction(&err);
    assert!(generate(&plans[1], &out("b.png"), &size).status.success());
    assert!(generate(&whole, &out("w.png"), &size).status.success());
    let (e, b, w) = (
        png_pixels(&out("e.png")),
        png_pixels(&out("b.png")),
        png_pixels(&out("w.png")),
    );
    let mean = |x: &[u8]| {
        x.iter()
            .zip(&w)
            .map(|(a, b)| f64::from(a.abs_diff(*b)))
            .sum::<f64>()
            / w.len() as f64
    };
    let (me, mb) = (mean(&e), mean(&b));
    eprintln!(
        "256x256, 96-px tiles: estimate {me:.2} levels from the whole image, tiles alone {mb:.2}"
    );
    assert!(
        me <= 11.0 && me < mb,
        "estimate {me:.2}, tiles alone {mb:.2}"
    );
}

/// A budget too small for the held activations in memory makes `edgeplan` hold them in a spill
/// file: peak RSS stays within the prediction (and below the untiled plan's), the image is the
/// untiled plan's, the spill folder is left empty; a spill folder that does not exist is a
/// one-line error naming it, with no image written.
#[test]
fn budget_forced_spilled_exact_tiles_stay_within_the_prediction() {
    let dir = tempfile::tempdir().unwrap();
    let (tiled, whole, text) = budget_plans(dir.path(), "150M");
    assert!(
        text.contains("exact tiles") && text.contains("spill file"),
        "{text}"
    );
    let spill = dir.path().join("spill");
    std::fs::create_dir(&spill).unwrap();
    let size = ["-W", "256", "-H", "256", "-s", "3"];
    let (a, b) = (dir.path().join("a.png"), dir.path().join("b.png"));
    let run_a = generate(
        &tiled,
        &a,
        &[&size[..], &["-v", "--spill-dir", s(&spill)]].concat(),
    );
    let err = String::from_utf8_lossy(&run_a.stderr);
    assert!(run_a.status.success(), "{err}");
    assert!(err.contains("in a spill file"), "{err}");
    let peak = within_prediction(&err);
    assert_eq!(
        entries(&spill),
        Vec::<String>::new(),
        "spill file left behind"
    );
    let run_b = generate(&whole, &b, &[&size[..], &["-v"]].concat());
    let whole_peak = kib_after(&String::from_utf8_lossy(&run_b.stderr), "peak RSS (VmHWM)");
    assert!(
        peak < whole_peak,
        "spilled {peak} KiB, untiled {whole_peak} KiB"
    );
    assert!(
        png_pixels(&a) == png_pixels(&b),
        "spilled exact tiles changed the image"
    );
    let c = dir.path().join("c.png");
    let missing = dir.path().join("no-such-folder");
    let bad = generate(
        &tiled,
        &c,
        &[&size[..], &["--spill-dir", s(&missing)]].concat(),
    );
    let msg = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success(), "{msg}");
    assert!(
        msg.contains("no-such-folder") && msg.contains("--spill-dir"),
        "{msg}"
    );
    assert!(!c.exists(), "an image was written after the decode failed");
}

/// A plan rewritten in place while `edgerun` runs on it ends the run with one error line
/// naming the plan, exit 1 and no image (issue 15, defect 8).
#[test]
fn a_plan_rewritten_during_a_run_gives_no_image() {
    use std::io::{BufRead, Seek, SeekFrom, Write};
    let t = tempfile::tempdir().unwrap();
    let plan = t.path().join("live.plan");
    std::fs::copy(demo_plan(), &plan).unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    let png = out_dir.path().join("x.png");
    let mut child = Command::new(EDGERUN)
        .args([
            "generate",
            "--plan",
            s(&plan),
            "-p",
            PROMPT,
            "--steps",
            "999",
            "-o",
            s(&png),
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        assert!(err.read_line(&mut line).unwrap() > 0, "ended early: {seen}");
        seen.push_str(&line);
        if line.starts_with("step 1/999") {
            break;
        }
    }
    // Same bytes written over the file in place (no truncation, so no fault): the run must
    // still notice the file changed.
    let bytes = std::fs::read(&plan).unwrap();
    let mut f = std::fs::OpenOptions::new().write(true).open(&plan).unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.write_all(&bytes).unwrap();
    f.sync_all().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(1), "{seen}{rest}");
    let last = rest.lines().last().unwrap_or("");
    assert!(
        last.starts_with("error: plan ")
            && last.contains("live.plan")
            && last.contains("changed while in use"),
        "{rest}"
    );
    assert!(
        entries(out_dir.path()).is_empty(),
        "{:?}",
        entries(out_dir.path())
    );
}

/// `edgeplan sign` refuses a public key, a key file whose `.pub` beside it is another key's,
/// and replacing another key's signature without `--resign`; `edgerun --trusted-key` refuses
/// a secret key. The plan is byte-identical after every refusal.
#[test]
fn signing_refuses_the_wrong_key_files() {
    let t = tempfile::tempdir().unwrap();
    let plan = t.path().join("s.plan");
    std::fs::copy(demo_plan(), &plan).unwrap();
    let (k1, k2) = (t.path().join("k1"), t.path().join("k2"));
    for k in [&k1, &k2] {
        let o = run(EDGEPLAN, &["keygen", "--out", s(k)]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let pub1 = t.path().join("k1.pub");
    let before = std::fs::read(&plan).unwrap();
    let refused = |args: &[&str], needles: &[&str]| {
        let o = run(EDGEPLAN, args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        for n in needles {
            assert!(err.contains(n), "{args:?}: no `{n}` in {err}");
        }
        assert!(
            std::fs::read(&plan).unwrap() == before,
            "{args:?} changed the plan"
        );
    };
    refused(
        &["sign", s(&plan), "--key", s(&pub1)],
        &["k1.pub", "public key"],
    );
    // A secret key file cut short after its label (32 of the 64 hex digits are 32 bytes) was
    // read as a raw seed and signed with a key nobody holds.
    let k1_text = std::fs::read(&k1).unwrap();
    let label_end = k1_text.iter().position(|&b| b == b' ').unwrap() + 1;
    let short = t.path().join("short");
    std::fs::write(&short, &k1_text[..label_end + 32]).unwrap();
    refused(
        &["sign", s(&plan), "--key", s(&short), "--resign"],
        &["short", "expected a secret key"],
    );
    // keygen onto an existing file (here the plan) says the file exists, not that it is a key.
    refused(
        &["keygen", "--out", s(&plan)],
        &["s.plan", "the file already exists"],
    );
    // The public key copied under a name without .pub: bare hex is not taken as a seed.
    let kp = t.path().join("kp");
    std::fs::copy(&pub1, &kp).unwrap();
    refused(
        &["sign", s(&plan), "--key", s(&kp), "--resign"],
        &["kp", "could as well be a public key"],
    );
    // A secret key whose KEY.pub beside it is another key's: not a pair.
    let mixed = t.path().join("mixed");
    std::fs::copy(&k2, &mixed).unwrap();
    std::fs::copy(&pub1, t.path().join("mixed.pub")).unwrap();
    refused(
        &["sign", s(&plan), "--key", s(&mixed)],
        &["mixed.pub", "not a pair"],
    );
    let o = run(EDGEPLAN, &["sign", s(&plan), "--key", s(&k1)]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let signed = std::fs::read(&plan).unwrap();
    let o = run(EDGEPLAN, &["sign", s(&plan), "--key", s(&k1)]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("already signed with key"));
    assert!(
        std::fs::read(&plan).unwrap() == signed,
        "same key: same bytes"
    );
    let before = signed.clone();
    let o = run(EDGEPLAN, &["sign", s(&plan), "--key", s(&k2)]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("already signed") && err.contains("--resign"),
        "{err}"
    );
    assert!(std::fs::read(&plan).unwrap() == before);
    let o = run(EDGEPLAN, &["sign", s(&plan), "--key", s(&k2), "--resign"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("replacing the signature by key"));
    // The device side: a secret key is not a trusted key.
    let out_dir = tempfile::tempdir().unwrap();
    let o = generate(
        &plan,
        &out_dir.path().join("x.png"),
        &["--trusted-key", s(&k2)],
    );
    assert_refused(
        "secret key as trusted key",
        &o,
        &["k2", "secret key", "KEY.pub"],
        out_dir.path(),
    );
    // A labelled public key cut to 32 hex digits is not a raw key either.
    let pub2 = std::fs::read_to_string(t.path().join("k2.pub")).unwrap();
    let short_pub = t.path().join("short.pub");
    std::fs::write(
        &short_pub,
        format!("edgediff-ed25519-public-key {}", &pub2.trim()[..32]),
    )
    .unwrap();
    let o = generate(
        &plan,
        &out_dir.path().join("x.png"),
        &["--trusted-key", s(&short_pub)],
    );
    assert_refused(
        "truncated labelled public key",
        &o,
        &["short.pub", "64 hexadecimal digits"],
        out_dir.path(),
    );
    let o = generate(
        &plan,
        &out_dir.path().join("x.png"),
        &["--trusted-key", s(&t.path().join("k2.pub")), "--quiet"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// A `--quant-rule` that decides no weight's type is an error naming it (before, it was
/// ignored without a word), in its several spellings of the mistake.
#[test]
fn quant_rules_that_match_nothing_are_refused() {
    for (rule, extra) in [
        ("no_such_layer=q8_0", None),
        ("norm=q8_0", None), // only never-quantized tensors
        ("transformer_blocks=q4_0", Some("attn1=q8_0")), // shadowed: the first rule takes all
        ("=q8_0", None),     // empty pattern: every matrix
    ] {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("q.plan");
        let model = demo_model();
        let mut args = compile_args(s(&model), s(&out), "64");
        args.extend(["--quant-rule", rule]);
        if let Some(e) = extra {
            args.extend(["--quant-rule", e]);
        }
        let o = run(EDGEPLAN, &args);
        let bad = extra.unwrap_or(rule);
        assert_refused(rule, &o, &["--quant-rule", &format!("`{bad}`")], t.path());
    }
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("q.plan");
    let model = demo_model();
    let mut args = compile_args(s(&model), s(&out), "64");
    args.extend(["--quant-rule", "attn1=q8_0"]);
    let o = run(EDGEPLAN, &args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// `edgeplan synth --force` replaces only a pipeline folder, never the current folder or one
/// holding it, and never a folder of other files.
#[test]
fn synth_force_never_replaces_what_it_did_not_write() {
    let t = tempfile::tempdir().unwrap();
    let work = t.path().join("work");
    std::fs::create_dir(&work).unwrap();
    std::fs::write(work.join("model_index.json"), b"{}").unwrap();
    std::fs::write(work.join("notes.txt"), b"mine").unwrap();
    // `edgeplan synth --preset pixart-sigma-small -o OUT --force`, run in `dir`.
    let synth_force = |dir: &Path, out: &str| {
        Command::new(EDGEPLAN)
            .current_dir(dir)
            .args([
                "synth",
                "--preset",
                "pixart-sigma-small",
                "-o",
                out,
                "--force",
            ])
            .output()
            .unwrap()
    };
    for out in [".", "..", s(&work)] {
        let o = synth_force(&work, out);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "-o {out}: {err}");
        assert!(err.contains("refusing to replace"), "-o {out}: {err}");
        assert_eq!(std::fs::read(work.join("notes.txt")).unwrap(), b"mine");
    }
    let other = t.path().join("docs");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("a.txt"), b"x").unwrap();
    let o = synth_force(t.path(), s(&other));
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not written by edgeplan synth"));
    assert!(other.join("a.txt").is_file());
    // A real pipeline folder (model_index.json and the user's files) is never replaced.
    let real = t.path().join("real");
    copy_demo(&real);
    std::fs::write(real.join("README.md"), b"mine").unwrap();
    let o = synth_force(t.path(), s(&real));
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(std::fs::read(real.join("README.md")).unwrap(), b"mine");
    assert!(real.join("transformer/config.json").is_file());
}

/// `--kv-cache-type` reaches the plan (`inspect` names the cache type), a bad value is refused
/// by name, and a q8_0-cache plan generates.
#[test]
fn kv_cache_type_is_chosen_at_compile_time() {
    let t = tempfile::tempdir().unwrap();
    let plan = t.path().join("q8kv.plan");
    let model = demo_model();
    let compile = |ty: &str, out: &Path| {
        let mut args = compile_args(s(&model), s(out), "64");
        args.extend(["--kv-cache-type", ty]);
        run(EDGEPLAN, &args)
    };
    let o = compile("bf16", &t.path().join("bad.plan"));
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--kv-cache-type") && err.contains("f32, f16 or q8_0"),
        "{err}"
    );
    assert!(!t.path().join("bad.plan").exists());
    let o = compile("q8_0", &plan);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(EDGEPLAN, &["inspect", s(&plan)]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("cross-attention K/V cache: q8_0"), "{text}");
    let o = run(EDGEPLAN, &["inspect", s(demo_plan())]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("cross-attention K/V cache: f32"), "{text}");
    let png = t.path().join("out.png");
    let o = generate(&plan, &png, &["--quiet"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(png.exists());
}

/// `--activation-bits 7`: a bad value, targets whose integer dot products take 8-bit
/// activations at full speed (aarch64, AVX-512 VNNI, cuda) and plans without `Q8_0` matrices are
/// refused before anything is written; a `q8_0` plan names the layout in `inspect` and
/// generates an image, with a warning where no 7-bit kernel runs it (the generic table).
#[test]
fn seven_bit_activations_are_chosen_at_compile_time() {
    let t = tempfile::tempdir().unwrap();
    let bad = t.path().join("bad.plan");
    let refused = |extra: &[&str], needles: &[&str]| {
        let o = compile_demo_64(&bad, extra);
        assert_eq!(o.status.code(), Some(1), "{extra:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        for n in needles {
            assert!(err.contains(n), "{extra:?}: `{n}` not in {err}");
        }
        assert!(!bad.exists(), "{extra:?} wrote a plan");
    };
    refused(
        &["--activation-bits", "6"],
        &["--activation-bits `6`", "8 or 7"],
    );
    refused(
        &["--activation-bits", " 7"],
        &["--activation-bits ` 7`", "8 or 7"],
    );
    for (target, why) in [
        ("aarch64-neon", "sdot"),
        ("x86_64-avx512", "vpdpbusd"),
        ("cuda-sm87", "GPU"),
    ] {
        refused(
            &[
                "--activation-bits",
                "7",
                "--quant",
                "q8_0",
                "--target",
                target,
            ],
            &["--activation-bits 7", target, why, "leave the flag out"],
        );
    }
    refused(
        &["--activation-bits", "7", "--quant", "f16"],
        &[
            "--activation-bits 7",
            "no Q8_0 linear weight",
            "--quant q8_0",
        ],
    );
    let plan = t.path().join("a7.plan");
    let o = compile_demo_64(&plan, &["--activation-bits", "7", "--quant", "q8_0"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(EDGEPLAN, &["inspect", s(&plan)]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("q8_0 (interleaved 8x4, 7-bit activations)"),
        "{text}"
    );
    let png = t.path().join("a7.png");
    let o = generate(&plan, &png, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(png.exists());
    let slow =
        "no fast kernel for this plan's 7-bit activations (edgeplan compile --activation-bits 7)";
    assert_eq!(err.contains(slow), !cfg!(target_arch = "x86_64"), "{err}");
    let o = generate(&plan, &t.path().join("g.png"), &["--kernels", "generic"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && err.contains(slow), "{err}");
}

/// `--attention-products bf16`: a bad value and a cuda target are refused before anything is
/// written; the plan's `inspect` says how many attention steps take bf16 products (the demo
/// plan's: f32), and it generates an image.
#[test]
fn attention_products_are_chosen_at_compile_time() {
    let t = tempfile::tempdir().unwrap();
    let plan = t.path().join("bf16att.plan");
    let model = demo_model();
    let compile = |extra: &[&str], out: &Path| {
        let mut args = compile_args(s(&model), s(out), "64");
        args.extend_from_slice(extra);
        run(EDGEPLAN, &args)
    };
    let bad = t.path().join("bad.plan");
    let o = compile(&["--attention-products", "fp8"], &bad);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--attention-products") && err.contains("f32 or bf16"),
        "{err}"
    );
    let o = compile(
        &["--attention-products", "bf16", "--target", "cuda-sm87"],
        &bad,
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--attention-products bf16") && err.contains("cuda"),
        "{err}"
    );
    assert!(!bad.exists());
    let o = compile(&["--attention-products", "BF16"], &plan);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(EDGEPLAN, &["inspect", s(&plan)]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("attention products: bf16 pairs in 12 of 24 attention steps"),
        "{text}"
    );
    let o = run(EDGEPLAN, &["inspect", s(demo_plan())]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("attention products: f32"), "{text}");
    // The GELUs fused into the products before them: some, not all, of the linear steps.
    let fused: Vec<usize> = text
        .lines()
        .find_map(|l| l.strip_prefix("fused epilogues: gelu_tanh in "))
        .unwrap_or_else(|| panic!("no fused-epilogue line: {text}"))
        .split(' ')
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(
        fused.len() == 2 && 0 < fused[0] && fused[0] < fused[1],
        "{text}"
    );
    let png = t.path().join("out.png");
    let o = generate(&plan, &png, &["--quiet"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(png.exists());
}

/// `edgerun generate` on a fixture plan with the fixtures' prompt "a lovely cat", quietly.
fn generate_cat(plan: &Path, png: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "generate",
        "--plan",
        s(plan),
        "-p",
        "a lovely cat",
        "--quiet",
        "-o",
        s(png),
    ];
    args.extend_from_slice(extra);
    run(EDGERUN, &args)
}

/// With the defaults (`--rng torch-cpu`, DPM++ 2M), `-s 42` gives the image diffusers gives for
/// `generator=torch.Generator("cpu").manual_seed(42)` (`tests/fixtures/seeded/`).
#[test]
fn seed_42_gives_the_diffusers_image_with_the_defaults() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let t = tempfile::tempdir().unwrap();
    let plan = t.path().join("sigma.plan");
    let o = run(
        EDGEPLAN,
        &compile_args(s(&fixtures.join("pixart-sigma-tiny")), s(&plan), "64"),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let png = t.path().join("cat.png");
    let o = generate_cat(
        &plan,
        &png,
        &["-n", "", "-s", "42", "--steps", "20", "--cfg-scale", "4.5"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ours = png_pixels(&png);
    let theirs = png_pixels(&fixtures.join("seeded/pipeline_dpm_20_cat_seed42_64x64.png"));
    assert_eq!(ours.len(), theirs.len());
    let over_one = ours
        .iter()
        .zip(&theirs)
        .filter(|(a, b)| a.abs_diff(**b) > 1)
        .count();
    let worst = ours.iter().zip(&theirs).map(|(a, b)| a.abs_diff(*b)).max();
    assert!(
        (over_one as f64) <= 0.005 * ours.len() as f64 && worst <= Some(3),
        "{over_one} of {} values off by more than one level, worst {worst:?}",
        ours.len()
    );
}

/// Without `--sampling-method` the plan's scheduler class decides: a PixArt-LCM folder
/// (`tests/fixtures/pixart-sigma-tiny-lcm`, assembled with the components of
/// `pixart-sigma-tiny`) generates with LCM and records it.
#[test]
fn the_default_sampler_is_the_one_the_plan_names() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let t = tempfile::tempdir().unwrap();
    let folder = t.path().join("lcm");
    for c in [
        "text_encoder",
        "tokenizer",
        "transformer",
        "vae",
        "scheduler",
    ] {
        let from = if c == "scheduler" {
            fixtures.join("pixart-sigma-tiny-lcm").join(c)
        } else {
            fixtures.join("pixart-sigma-tiny").join(c)
        };
        std::fs::create_dir_all(folder.join(c)).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), folder.join(c).join(e.file_name())).unwrap();
        }
    }
    std::fs::copy(
        fixtures.join("pixart-sigma-tiny-lcm/model_index.json"),
        folder.join("model_index.json"),
    )
    .unwrap();
    let plan = t.path().join("lcm.plan");
    let o = run(EDGEPLAN, &compile_args(s(&folder), s(&plan), "64"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let png = t.path().join("cat.png");
    let o = generate_cat(
        &plan,
        &png,
        &["-s", "1234", "--steps", "4", "--cfg-scale", "0"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = png_text(&std::fs::read(&png).unwrap());
    let (_, _, f) = a1111(&text.iter().find(|(k, _)| k == "parameters").unwrap().1);
    assert_eq!(f["Sampler"], "LCM");
    let ours = png_pixels(&png);
    let theirs =
        png_pixels(&fixtures.join("pixart-sigma-tiny-lcm/reference/pipeline_lcm_4_cat_64x64.png"));
    let worst = ours.iter().zip(&theirs).map(|(a, b)| a.abs_diff(*b)).max();
    assert!(
        worst <= Some(1),
        "off by {worst:?} levels from diffusers' LCM image"
    );
}

/// `--scheduler karras` is recorded as A1111 writes it; asked of a sampler it is not
/// implemented for, or misspelt, it is refused before any work.
#[test]
fn karras_sigmas_are_chosen_and_recorded() {
    let t = tempfile::tempdir().unwrap();
    let png = t.path().join("k.png");
    let o = generate(demo_plan(), &png, &["--quiet", "--scheduler", "karras"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = png_text(&std::fs::read(&png).unwrap());
    let (_, _, f) = a1111(&text.iter().find(|(k, _)| k == "parameters").unwrap().1);
    assert_eq!(f["Schedule type"], "Karras");
    assert_eq!(f["Sampler"], "DPM++ 2M");
    let other = t.path().join("o.png");
    for (args, text) in [
        (
            vec!["--scheduler", "karras", "--sampling-method", "euler_a"],
            "karras sigmas are implemented for --sampling-method dpm++2m, euler, heun and dpm2, not euler_a",
        ),
        (
            vec!["--scheduler", "exponential"],
            "--scheduler exponential: expected discrete or karras",
        ),
    ] {
        let o = generate(demo_plan(), &other, &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(text), "{args:?}: {err}");
        assert!(!other.exists());
    }
}

/// `-b N` makes N images with seeds s, s+1, …, named by `%d` (or `_1`…`_N`); image k is the
/// image a single run with seed s+k−1 makes, byte for byte.
#[test]
fn batch_count_makes_consecutive_seeds() {
    let t = tempfile::tempdir().unwrap();
    let pattern = t.path().join("cat_%d.png");
    let o = generate(demo_plan(), &pattern, &["--quiet", "-s", "5", "-b", "3"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for (k, seed) in [(1, "5"), (2, "6"), (3, "7")] {
        let png = std::fs::read(t.path().join(format!("cat_{k}.png"))).unwrap();
        let text = png_text(&png);
        let (_, _, f) = a1111(&text.iter().find(|(k, _)| k == "parameters").unwrap().1);
        assert_eq!(f["Seed"], seed, "image {k}");
    }
    let single = t.path().join("single.png");
    let o = generate(demo_plan(), &single, &["--quiet", "-s", "6"]);
    assert!(o.status.success());
    assert_eq!(
        std::fs::read(&single).unwrap(),
        std::fs::read(t.path().join("cat_2.png")).unwrap(),
        "image 2 of the batch differs from a run with seed 6"
    );
    // Without %d: _1, _2 before the extension.
    let plain = t.path().join("dog.png");
    let o = generate(demo_plan(), &plain, &["--quiet", "-b", "2"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(t.path().join("dog_1.png").exists() && t.path().join("dog_2.png").exists());
    assert!(!plain.exists());
    for (args, text) in [
        (vec!["-b", "0"], "-b/--batch-count 0: expected 1 to 1000"),
        (
            vec!["-b", "2", "--init-latents", "x.safetensors"],
            "with --init-latents",
        ),
    ] {
        let out = t.path().join("refused_%d.png");
        let o = generate(demo_plan(), &out, &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(text), "{args:?}: {err}");
    }
}

/// Settings that cannot give a good image are refused before any output: a folder as `-o`
/// (with or without `-b`), a batch name that is a folder, a schedule that repeats a timestep
/// (1000 linspace steps), more LCM steps than its original schedule, a guidance scale of 1e30.
#[test]
fn unusable_outputs_and_schedules_are_refused_before_any_work() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("out");
    std::fs::create_dir(&dir).unwrap();
    std::fs::create_dir(dir.join("x_2.png")).unwrap();
    let slash = format!("{}/", dir.display());
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["-o".into(), slash.clone(), "-b".into(), "2".into()],
            "names a folder",
        ),
        (
            vec!["-o".into(), s(&dir).into()],
            "exists and is not a regular file (a folder)",
        ),
        (
            vec![
                "-o".into(),
                s(&dir.join("x.png")).into(),
                "-b".into(),
                "3".into(),
            ],
            "x_2.png: exists and is not a regular file",
        ),
        (
            vec!["--steps".into(), "1000".into()],
            "give the timestep 500 twice",
        ),
        (
            vec![
                "--sampling-method".into(),
                "lcm".into(),
                "--steps".into(),
                "51".into(),
            ],
            "expected 1..=50 (LCM's original_inference_steps)",
        ),
        (
            vec!["--cfg-scale".into(), "1e30".into()],
            "--cfg-scale 1000000000000000000000000000000: expected a number from 0 to 100",
        ),
    ];
    for (args, text) in &cases {
        let mut full = vec![
            "generate".to_string(),
            "--plan".into(),
            s(demo_plan()).into(),
            "-p".into(),
            PROMPT.into(),
        ];
        if !args.iter().any(|a| a == "-o") {
            full.extend(["-o".into(), s(&dir.join("ok.png")).into()]);
        }
        full.extend(args.iter().cloned());
        let refs: Vec<&str> = full.iter().map(String::as_str).collect();
        let o = run(EDGERUN, &refs);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(text), "{args:?}: {err}");
        let mut left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        left.sort();
        assert_eq!(left, ["x_2.png"], "{args:?} left files behind");
    }
}

/// `edgeplan compile` reports its reading and writing phases (plain lines when stderr is not a
/// terminal, percentages with MB and an ETA); `--quiet` silences them.
#[test]
fn compile_reports_progress_unless_quiet() {
    let t = tempfile::tempdir().unwrap();
    let plan = t.path().join("p.plan");
    let m = demo_model();
    let o = run(EDGEPLAN, &compile_args(s(&m), s(&plan), "64"));
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    // Per phase, the percentages (of the bytes themselves) rise from at least 10 % and agree
    // with the MB beside them; the writing ends at 100 %.
    for phase in ["reading weights: ", "writing the plan: "] {
        let pcts: Vec<(u64, u64, u64)> = err
            .lines()
            .filter_map(|l| l.strip_prefix(phase))
            .map(|l| {
                let (pct, rest) = l.split_once("% (").expect("N% (");
                let (done, rest) = rest.split_once(" of ").expect("of");
                let total = rest.split_once(" MB").expect("MB").0;
                let n = |x: &str| x.parse::<u64>().expect("a number");
                (n(pct), n(done), n(total))
            })
            .collect();
        assert!(!pcts.is_empty(), "no {phase:?} line: {err}");
        for w in pcts.windows(2) {
            assert!(w[0].0 < w[1].0, "{phase:?} percentages do not rise: {err}");
        }
        for &(pct, done, total) in &pcts {
            assert!((10..=100).contains(&pct) && done <= total, "{err}");
            // `done` and `total` are whole MB rounded down: `done` is within 1 MB of pct·total.
            assert!(done * 100 <= pct * (total + 1) + 100, "{err}");
            assert!(pct * total <= (done + 1) * 100, "{err}");
        }
    }
    assert!(err.contains("writing the plan: 100% ("), "{err}");
    assert!(err.contains(" eta "), "{err}");
    let mut args = compile_args(s(&m), s(&plan), "64");
    args.push("--quiet");
    let o = run(EDGEPLAN, &args);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !err.contains("reading weights") && !err.contains("writing the plan"),
        "{err}"
    );
}

/// `edgeplan compile --lora FILE[:MULTIPLIER]` records the LoRA (file name, multiplier,
/// format, layers, rank, digest) and `inspect` shows it; a multiplier that is not a number and
/// a LoRA for another model are refused by name, leaving no plan.
/// Inputs given as a device are refused by name instead of being read without end (fresh-user
/// trial: `--tokenizer /dev/zero` grew edgeplan until the kernel killed it).
#[test]
fn device_inputs_are_refused_not_read() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let model = fixtures.join("pixart-sigma-tiny");
    let t = tempfile::tempdir().unwrap();
    let plan = t.path().join("x.plan");
    let mut args = compile_args(s(&model), s(&plan), "64");
    args.extend(["--tokenizer", "/dev/zero", "--quiet"]);
    let o = run(EDGEPLAN, &args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--tokenizer /dev/zero: not a regular file"),
        "{err}"
    );
    assert!(!plan.exists(), "a refused compile wrote its plan");
    let png = t.path().join("x.png");
    let o = run(
        EDGERUN,
        &[
            "generate",
            "--plan",
            s(&plan),
            "-p",
            "x",
            "-i",
            "/dev/zero",
            "-o",
            s(&png),
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("-i/--init-img /dev/zero: not a regular file"),
        "{err}"
    );
    assert!(!png.exists(), "a refused run wrote its output");
}

/// `edgeplan compile -o` naming one of its `--lora` files (a LoRA saved under a `.plan` name,
/// or reached through a hard link) is refused before anything is written, like the model's own
/// files (fresh-user trial: it used to replace the LoRA with the plan).
#[test]
fn compile_refuses_to_write_over_its_lora() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let model = fixtures.join("pixart-sigma-tiny");
    let lora = fixtures.join("lora/pixart-sigma-tiny-lora-r4.kohya.safetensors");
    let t = tempfile::tempdir().unwrap();
    let mine = t.path().join("mine.plan");
    std::fs::copy(&lora, &mine).unwrap();
    let linked = t.path().join("linked.plan");
    std::fs::hard_link(&mine, &linked).unwrap();
    let before = std::fs::read(&mine).unwrap();
    for out in [&mine, &linked] {
        let arg = format!("{}:0.8", s(&mine));
        let mut args = compile_args(s(&model), s(out), "64");
        args.extend(["--lora", &arg, "--quiet"]);
        let o = run(EDGEPLAN, &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(
            err.contains("refusing to write over an input") && err.contains("--lora"),
            "{err}"
        );
        assert!(
            std::fs::read(&mine).unwrap() == before,
            "compile overwrote its --lora input"
        );
    }
}

#[test]
fn lora_is_merged_recorded_and_shown() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let model = fixtures.join("pixart-sigma-tiny");
    let lora = fixtures.join("lora/pixart-sigma-tiny-lora-r4.kohya.safetensors");
    let t = tempfile::tempdir().unwrap();
    let plan = t.path().join("lora.plan");
    let arg = format!("{}:0.8", s(&lora));
    let mut args = compile_args(s(&model), s(&plan), "64");
    args.extend(["--lora", &arg, "--quiet"]);
    let o = run(EDGEPLAN, &args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&run(EDGEPLAN, &["inspect", s(&plan)]).stdout).to_string();
    let digest: String = blake3::hash(&std::fs::read(&lora).unwrap()).as_bytes()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let want = format!(
        "lora: pixart-sigma-tiny-lora-r4.kohya.safetensors × 0.8 (kohya, 20 layers, rank 4, blake3 {digest})"
    );
    assert!(text.contains(&want), "{text}");

    let out_dir = t.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let bad_plan = out_dir.join("bad.plan");
    let arg = format!("{}:strong", s(&lora));
    let mut args = compile_args(s(&model), s(&bad_plan), "64");
    args.extend(["--lora", &arg]);
    assert_refused(
        "non-numeric multiplier",
        &run(EDGEPLAN, &args),
        &["--lora", "`strong`"],
        &out_dir,
    );
    // A LoRA of pixart-sigma-tiny given to the demo model (other widths).
    let demo = demo_model();
    let mut args = compile_args(s(&demo), s(&bad_plan), "64");
    let arg = s(&lora).to_string();
    args.extend(["--lora", &arg]);
    assert_refused(
        "LoRA of another model",
        &run(EDGEPLAN, &args),
        &["kohya.safetensors", "another model"],
        &out_dir,
    );
}

/// `edgerun generate -i IMAGE --strength S` follows the img2img reference
/// (`tests/fixtures/img2img/`, seed 2024 drawn by torch's CPU generator) and records the
/// strength and the image's name; bad init images (another size, grayscale, 16-bit,
/// truncated, missing), `--strength` out of range or without `-i`, an output over the init
/// image and a plan without a VAE encoder are refused by name, writing nothing.
#[test]
fn img2img_follows_the_reference_and_refuses_bad_init_images() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let t = tempfile::tempdir().unwrap();
    let plan = t.path().join("sigma.plan");
    let model = fixtures.join("pixart-sigma-tiny");
    let o = run(EDGEPLAN, &compile_args(s(&model), s(&plan), "64"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let input = fixtures.join("img2img/input_A_64x64.png");
    let png = t.path().join("cat.png");
    let args = [
        "-i",
        s(&input),
        "--strength",
        "0.6",
        "--steps",
        "10",
        "-s",
        "2024",
        "-n",
        "",
    ];
    let o = generate_cat(&plan, &png, &args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ours = png_pixels(&png);
    let theirs = png_pixels(&fixtures.join("img2img/pipeline_dpm_10_s0.6_cat_64x64.png"));
    let worst = ours.iter().zip(&theirs).map(|(a, b)| a.abs_diff(*b)).max();
    assert!(worst <= Some(3), "worst {worst:?}");
    let text = png_text(&std::fs::read(&png).unwrap());
    let params = &text.iter().find(|(k, _)| k == "parameters").unwrap().1;
    assert!(
        params.contains("Denoising strength: 0.6")
            && params.contains("Init image: input_A_64x64.png"),
        "{params}"
    );

    let out_dir = t.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let out = out_dir.join("x.png");
    let write = |name: &str, w: u32, h: u32, color: png::ColorType, depth: png::BitDepth| {
        let p = t.path().join(name);
        let per = match color {
            png::ColorType::Grayscale => 1,
            _ => 3,
        } * if depth == png::BitDepth::Sixteen {
            2
        } else {
            1
        };
        let mut buf = Vec::new();
        let mut enc = png::Encoder::new(&mut buf, w, h);
        enc.set_color(color);
        enc.set_depth(depth);
        let mut wr = enc.write_header().unwrap();
        wr.write_image_data(&vec![100u8; (w * h) as usize * per])
            .unwrap();
        wr.finish().unwrap();
        std::fs::write(&p, buf).unwrap();
        p
    };
    use png::{BitDepth as D, ColorType as C};
    let small = write("small.png", 32, 48, C::Rgb, D::Eight);
    let gray = write("gray.png", 64, 64, C::Grayscale, D::Eight);
    let deep = write("deep.png", 64, 64, C::Rgb, D::Sixteen);
    let cut = t.path().join("cut.png");
    let whole = std::fs::read(&input).unwrap();
    std::fs::write(&cut, &whole[..whole.len() / 2]).unwrap();
    let refused = |what: &str, extra: &[&str], needles: &[&str]| {
        let o = generate_cat(&plan, &out, extra);
        assert_refused(what, &o, needles, &out_dir);
    };
    refused(
        "wrong size",
        &["-i", s(&small)],
        &["small.png", "32x48", "64x64"],
    );
    refused("grayscale", &["-i", s(&gray)], &["gray.png", "grayscale"]);
    refused("16-bit", &["-i", s(&deep)], &["deep.png", "16 bits"]);
    refused("truncated", &["-i", s(&cut)], &["cut.png", "truncated"]);
    let missing = t.path().join("missing.png");
    refused("missing", &["-i", s(&missing)], &["missing.png"]);
    refused(
        "strength range",
        &["-i", s(&input), "--strength", "1.5"],
        &["--strength 1.5", "(0, 1]"],
    );
    refused(
        "no step",
        &["-i", s(&input), "--strength", "0.01"],
        &["--strength 0.01", "no denoising step"],
    );
    refused(
        "strength alone",
        &["--strength", "0.5"],
        &["--strength", "-i/--init-img"],
    );
    // A negative value reaches the range check instead of clap's "unexpected argument".
    refused(
        "negative strength",
        &["-i", s(&input), "--strength", "-0.1"],
        &["--strength -0.1", "(0, 1]"],
    );
    // The output may not be the init image.
    let victim = out_dir.join("in.png");
    std::fs::copy(&input, &victim).unwrap();
    let o = run(
        EDGERUN,
        &[
            "generate",
            "--plan",
            s(&plan),
            "-p",
            "x",
            "--quiet",
            "-i",
            s(&victim),
            "-o",
            s(&victim),
        ],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("-i/--init-img"), "{err}");
    assert_eq!(
        std::fs::read(&victim).unwrap(),
        whole,
        "the init image was overwritten"
    );
    std::fs::remove_file(&victim).unwrap();
    // A plan without the encoder.
    let bare = t.path().join("bare.plan");
    let mut args = compile_args(s(&model), s(&bare), "64");
    args.push("--no-vae-encoder");
    let o = run(EDGEPLAN, &args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::metadata(&bare).unwrap().len() < std::fs::metadata(&plan).unwrap().len());
    let o = run(
        EDGERUN,
        &[
            "generate",
            "--plan",
            s(&bare),
            "-p",
            "x",
            "--quiet",
            "-i",
            s(&input),
            "-o",
            s(&out),
        ],
    );
    assert_refused("no encoder", &o, &["no VAE encoder"], &out_dir);
    let inspect =
        String::from_utf8_lossy(&run(EDGEPLAN, &["inspect", s(&bare)]).stdout).to_string();
    assert!(
        inspect.contains("VAE encoder (image to image): none"),
        "{inspect}"
    );
    let inspect =
        String::from_utf8_lossy(&run(EDGEPLAN, &["inspect", s(&plan)]).stdout).to_string();
    assert!(
        inspect.contains("VAE encoder (image to image): 64x64"),
        "{inspect}"
    );
}

/// `edgeplan compile --taesd DIR` adds the tiny decoder (`inspect` lists it); `edgerun
/// --decoder tae` decodes with it and `--preview tae --preview-interval N` writes previews to
/// `--preview-path` (the last one: the final image, for DPM-Solver++); a plan without it, a
/// preview path that is the output, an unknown decoder and a VAE given as `--taesd` are
/// refused by name.
#[test]
fn taesd_decodes_and_previews() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let model = fixtures.join("pixart-sigma-tiny");
    let t = tempfile::tempdir().unwrap();
    let plan = t.path().join("tae.plan");
    let taesd = fixtures.join("taesd/taesd-tiny");
    let mut args = compile_args(s(&model), s(&plan), "64");
    args.extend(["--taesd", s(&taesd), "--quiet"]);
    let o = run(EDGEPLAN, &args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&run(EDGEPLAN, &["inspect", s(&plan)]).stdout).to_string();
    assert!(
        text.contains("tiny decoder (TAESD: --decoder tae, --preview tae): 64x64"),
        "{text}"
    );
    let png = t.path().join("tae.png");
    let preview = t.path().join("live.png");
    let o = generate_cat(
        &plan,
        &png,
        &[
            "--steps",
            "4",
            "--decoder",
            "tae",
            "--preview",
            "tae",
            "--preview-path",
            s(&preview),
            "--preview-interval",
            "2",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(png_pixels(&preview), png_pixels(&png));
    let vae_png = t.path().join("vae.png");
    let o = generate_cat(&plan, &vae_png, &["--steps", "4"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_ne!(png_pixels(&vae_png), png_pixels(&png));

    let out_dir = t.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let out = out_dir.join("x.png");
    let o = generate_cat(&plan, &out, &["--decoder", "tiny"]);
    assert_refused(
        "unknown decoder",
        &o,
        &["--decoder tiny", "vae or tae"],
        &out_dir,
    );
    let o = generate_cat(
        &plan,
        &out,
        &["--preview", "tae", "--preview-path", s(&out)],
    );
    assert_refused("preview over the output", &o, &["--preview-path"], &out_dir);
    // The preview options without a preview are refused, not ignored.
    let live = out_dir.join("live.png");
    for (extra, flag) in [
        (vec!["--preview-path", s(&live)], "--preview-path"),
        (vec!["--preview-interval", "2"], "--preview-interval"),
        (vec!["--preview-noisy"], "--preview-noisy"),
        (
            vec!["--preview", "none", "--preview-path", s(&live)],
            "--preview-path",
        ),
    ] {
        let o = generate_cat(&plan, &out, &extra);
        assert_refused(
            &format!("{extra:?} without a preview"),
            &o,
            &[flag, "applies to previews only", "--preview tae|vae"],
            &out_dir,
        );
    }
    let bare = t.path().join("bare.plan");
    let o = run(EDGEPLAN, &compile_args(s(&model), s(&bare), "64"));
    assert!(o.status.success());
    let o = generate_cat(&bare, &out, &["--decoder", "tae"]);
    assert_refused(
        "no tiny decoder",
        &o,
        &["no tiny decoder", "--taesd"],
        &out_dir,
    );
    let y = out_dir.join("y.plan");
    let mut args = compile_args(s(&model), s(&y), "64");
    let vae = model.join("vae");
    args.extend(["--taesd", s(&vae)]);
    assert_refused(
        "an AutoencoderKL as --taesd",
        &run(EDGEPLAN, &args),
        &["--taesd", "AutoencoderTiny"],
        &out_dir,
    );
}

/// `edgeplan compile -o` naming an existing folder is refused before any weight is read (no
/// progress line, no plan), as `edgerun generate -o` is.
#[test]
fn compile_to_a_folder_is_refused_before_reading() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("plans.plan");
    std::fs::create_dir(&dir).unwrap();
    let o = compile_demo_64(&dir, &[]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("exists and is not a regular file (a folder)") && !err.contains("reading"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "wrote into the folder"
    );
}

#[test]
fn steps_must_be_a_whole_number_of_at_least_one() {
    let empty = tempfile::tempdir().unwrap();
    let png = empty.path().join("x.png");
    let args = |steps| {
        vec![
            "generate",
            "--plan",
            s(demo_plan()),
            "-p",
            PROMPT,
            "-o",
            s(&png),
            "--quiet",
            "--steps",
            steps,
        ]
    };
    let o = run(EDGERUN, &args("0"));
    assert_refused("--steps 0", &o, &["--steps", "at least 1"], empty.path());
    // A negative count reaches the flag's own parser (not clap's "unexpected argument '-3'").
    let o = run(EDGERUN, &args("-3"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("'--steps <STEPS>'") && err.contains("whole number of at least 1"),
        "{err}"
    );
    assert!(!png.exists(), "a refused run wrote {}", png.display());
}

/// A quantization type that falls back on many matrices is summed up in one note per (asked,
/// stored) pair on stderr; `edgeplan inspect` still lists every matrix.
#[test]
fn compile_sums_up_quant_fallbacks() {
    let t = tempfile::tempdir().unwrap();
    let plan = t.path().join("k.plan");
    let m = demo_model();
    let mut args = compile_args(s(&m), s(&plan), "64");
    args.extend(["--quant", "q4_k", "--quiet"]);
    let o = run(EDGEPLAN, &args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let notes: Vec<&str> = err.lines().filter(|l| l.starts_with("note: ")).collect();
    assert_eq!(notes.len(), 1, "{err}");
    let count: usize = notes[0]
        .strip_prefix("note: ")
        .and_then(|l| l.split_once(" matrices asked q4_k, stored q4_0 (the first, "))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("{err}"));
    let o = run(EDGEPLAN, &["inspect", s(&plan)]);
    let listed = String::from_utf8_lossy(&o.stdout)
        .matches(": asked q4_k, stored q4_0 (")
        .count();
    assert!(
        count > 1 && listed == count,
        "{count} summed, {listed} listed"
    );
}

/// `--target x86_64-avx512bf16 --quant bf16`: the plan's BF16 matrices are in the pairs layout
/// (`inspect` says so, and that their products are bf16 ones); on a CPU with AVX512_BF16 `edgerun
/// -v` names the `vdpbf16ps` kernel and the image is written; on another x86-64 CPU the plan is
/// refused, naming the missing feature.
#[test]
fn bf16_products_target() {
    let dir = tempfile::tempdir().unwrap();
    let compile = |quant: &str, out: &Path| {
        compile_demo_64(
            out,
            &["--quant", quant, "--target", "x86_64-avx512bf16", "--quiet"],
        )
    };
    let plan = dir.path().join("bf16.plan");
    let o = compile("bf16", &plan);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(EDGEPLAN, &["inspect", s(&plan)]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("bf16 (pairs 16x2, bf16 products)"),
        "inspect does not show the pairs layout:\n{text}"
    );
    // The target with no BF16 matrix: the plan still demands avx512bf16, and says so.
    let o = compile("q8_0", &dir.path().join("q8.plan"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success()
            && err.contains("no BF16 linear weight")
            && err.contains("requires avx512bf16")
            && err.contains("--quant bf16"),
        "{err}"
    );
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    let png = dir.path().join("x.png");
    let generate = |extra: &[&str]| {
        let mut args = vec!["generate", "--plan", s(&plan), "-p", "a cat", "-o", s(&png)];
        args.extend_from_slice(extra);
        run(EDGERUN, &args)
    };
    let o = generate(&["--steps", "2", "-v"]);
    let err = String::from_utf8_lossy(&o.stderr);
    if edge_kernels_cpu::features().avx512bf16 && edge_kernels_cpu::features().avx512vnni {
        assert!(o.status.success(), "{err}");
        assert!(
            err.contains("bf16 (pairs 16x2) -> avx512bf16_linear_pairs_6x64"),
            "-v does not name the vdpbf16ps kernel:\n{err}"
        );
        assert!(
            png.exists() && !err.contains("no vdpbf16ps kernel"),
            "{err}"
        );
        // A table without the kernel runs the generic one, and says so without -v.
        let o = generate(&["--steps", "1", "--kernels", "avx512+vnni"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.success() && err.contains("has no vdpbf16ps kernel"),
            "{err}"
        );
    } else {
        assert!(!o.status.success() && err.contains("avx512bf16"), "{err}");
        assert!(!png.exists());
    }
}

/// Errors name what was meant: a misspelled `--target` or `--kernels` gets the closest name,
/// `sign --key` a missing key file under `--key`, and a plan given as the model with the same
/// `-o` is called the model file (not a folder). Without `-p` the run says it uses the empty
/// prompt; `-v` says when F16 weights are widened for an f32 kernel.
#[test]
fn errors_name_the_flag_and_the_likely_spelling() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("x.plan");
    let model = demo_model();
    let mut args = compile_args(s(&model), s(&out), "64");
    args.extend(["--target", "x86_64-avx512bf"]);
    let o = run(EDGEPLAN, &args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("did you mean `x86_64-avx512bf16`?"), "{err}");
    let o = run(
        EDGEPLAN,
        &["sign", "--key", "/nonexistent/edge.key", s(demo_plan())],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("--key: /nonexistent/edge.key"), "{err}");
    let plan = t.path().join("copy.plan");
    std::fs::copy(demo_plan(), &plan).unwrap();
    let o = run(EDGEPLAN, &compile_args(s(&plan), s(&plan), "64"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("the model file") && !err.contains("folder"),
        "{err}"
    );
    let png = t.path().join("a.png");
    let o = run(
        EDGERUN,
        &[
            "generate",
            "--plan",
            s(demo_plan()),
            "--kernels",
            "avx2+",
            "-o",
            s(&png),
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("did you mean `avx2`?"), "{err}");
    let o = run(
        EDGERUN,
        &[
            "generate",
            "--plan",
            s(demo_plan()),
            "--steps",
            "1",
            "-o",
            s(&png),
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("no -p/--prompt"), "{err}");
    let f16 = t.path().join("f16.plan");
    let o = compile_demo_64(&f16, &["--quant", "f16"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = generate(&f16, &png, &["-v"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("matrix kernels:"))
        .unwrap_or_else(|| panic!("no matrix kernels line: {err}"));
    let f16 = line
        .split(", ")
        .find(|p| p.contains("f16 -> "))
        .unwrap_or_else(|| panic!("no f16 weights: {line}"));
    // An f32 kernel (x86 or NEON tiles) widens them; a generic F16 kernel would not.
    assert_eq!(
        f16.contains("_f32"),
        f16.contains("(widened to f32 panels)"),
        "{line}"
    );
}
